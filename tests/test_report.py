"""The run report (renderer, end to end through the CLI), progress lines and
the neardup counters."""

import json
import logging
import os
from html.parser import HTMLParser

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline import job
from pipeline.cli import main
from tests.corpus import read_jsonl, seed_corpus, stats_of, write_jsonl
from transforms import metrics, stats as stat_names
from transforms.config import DedupConfig
from transforms.finalize import claim_output, release_claim
from transforms.report import Summary, SummarizeClusters
from transforms.report_render import (LARGEST_CLUSTERS, MEMBERS_SHOWN,
                                      STAGES, assemble, render_html, s_curve,
                                      snippet)
from transforms.select import ClusterColumns, ClusterInfo, cluster_columns
from transforms.stats import finalize_stats

SECTIONS = ("parameters", "counts", "s-curve", "bucket-sizes",
            "cluster-sizes", "edges", "components", "timings",
            "largest-clusters")
SCRIPT_TEXT = "<script>alert('x')</script> & the quick brown fox " * 3
ARGS = ["--ngram", "3", "--bands", "32", "--rows", "4", "--threshold", "0.4"]
_VOID = {"meta", "br", "hr", "img", "input", "link", "area", "base", "col",
         "embed", "source", "track", "wbr"}


class Page(HTMLParser):
  """Checks nesting and collects tags, section ids and data-stat texts."""

  def __init__(self, text):
    super().__init__(convert_charrefs=True)
    self.open, self.errors, self.tags = [], [], []
    self.stats, self.text = {}, []
    self._capture = None
    self.feed(text)
    self.close()
    if self.open:
      self.errors.append(f"unclosed {self.open}")

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    self.tags.append((tag, attrs))
    if tag not in _VOID:
      self.open.append(tag)
    if "data-stat" in attrs:
      self._capture = attrs["data-stat"]

  def handle_startendtag(self, tag, attrs):
    self.tags.append((tag, dict(attrs)))

  def handle_endtag(self, tag):
    if not self.open or self.open[-1] != tag:
      self.errors.append(f"</{tag}> closes {self.open[-1:]}")
    else:
      self.open.pop()

  def handle_data(self, data):
    self.text.append(data)
    if self._capture:
      self.stats[self._capture] = data
      self._capture = None

  def ids(self):
    return {a["id"] for _, a in self.tags if "id" in a}

  def number(self, stat):
    return int(self.stats[stat].replace(",", ""))


def check_page(text):
  """Parses a rendered report; asserts it is well-formed and offline."""
  assert text.startswith("<!DOCTYPE html>")
  page = Page(text)
  assert not page.errors, page.errors
  names = [t for t, _ in page.tags]
  assert names.count("html") == names.count("body") == 1
  assert set(SECTIONS) <= page.ids()
  # Nothing to run and nothing fetched: no script, no external resource.
  assert not {"script", "link", "img", "iframe", "object"} & set(names)
  assert not [a for _, a in page.tags if "src" in a or "href" in a]
  return page


def check_stat_cells(page, stats):
  for name in ("docs_in", "kept", "removed", "rejected", "docs_signed",
               "docs_empty", "buckets_multi", "clusters", "clustered_docs",
               "candidate_edges", "verified_edges", "cc_rounds_used",
               "cc_residual_edges", "cc_residual_nodes"):
    assert page.number(name) == stats[name], name
  for k, n in enumerate(stats["cluster_size_log2"]):
    if n:
      assert page.number(f"cluster_size_log2_{k:02d}") == n
  for reason, n in stats["rejected_by_reason"].items():
    assert page.number("rejected_" + reason) == n


def test_size_bins_are_exact_floor_log2():
  sizes = [1, 2, 3, 4, 7, 8, 2**31 - 1, 2**31, 2**52 + 1]
  assert metrics.log2_bins(sizes).tolist() == [0, 1, 1, 2, 2, 3, 30, 31, 52]


def test_stat_names_read_back_as_they_were_built():
  built = {stat_names.rejected_stat("blank_line"): ("rejected", "blank_line"),
           stat_names.shuffle_stat("write"): ("shuffle", "write"),
           stat_names.round_stat(12): ("round", 12),
           stat_names.timing_stat("band_keys"): ("timing", "band_keys"),
           stat_names.size_bin_stat(stat_names.CLUSTER_SIZES, 4): (
               "histogram", (stat_names.CLUSTER_SIZES, 4))}
  built.update((name, ("count", name)) for name in stat_names.COUNTS)
  assert {name: tuple(stat_names.parse_stat(name))
          for name in built} == built


def test_finalize_stats_adds_histograms_and_leaves_timings_out():
  counts = {"docs_in": 9, "kept": 5, "removed": 4, "clusters": 2,
            "clustered_docs": 6, "bucket_size_log2_01": 7,
            "bucket_size_log2_03": 1, "cluster_size_log2_01": 1,
            "cluster_size_log2_02": 1, "worker_ms_signatures": 12}
  stats = finalize_stats(counts, {"max_cc_rounds": 2})
  assert stats["bucket_size_log2"] == [0, 7, 0, 1]
  assert stats["cluster_size_log2"] == [0, 1, 1]
  assert not [k for k in stats if "worker" in k or "_log2_" in k]
  empty = finalize_stats({}, {})
  assert empty["bucket_size_log2"] == empty["cluster_size_log2"] == []


def test_s_curve_follows_the_banding_formula():
  points = s_curve(bands=20, rows=5)
  assert points[0] == [0.0, 0.0] and points[-1] == [1.0, 1.0]
  s, p = points[50]
  assert p == pytest.approx(1 - (1 - s**5)**20, abs=1e-6)
  assert all(a[1] <= b[1] for a, b in zip(points, points[1:]))


def test_snippet_collapses_whitespace_and_cuts():
  assert snippet("  a\n\tb   c ") == "a b c"
  cut = snippet("word " * 100, limit=20)
  assert len(cut) == 20 and cut.endswith("…")


def _sample_report():
  params = {"bands": 32, "rows": 4, "threshold": 0.4, "verify": "signature",
            "lsh_threshold": round((1 / 32)**0.25, 6), "max_cc_rounds": 3,
            "text_field": "<b>x</b>"}
  counts = {"docs_in": 12, "kept": 7, "removed": 4, "rejected": 1,
            "rejected_malformed_json": 1, "docs_signed": 11,
            "buckets_multi": 40, "bucket_size_log2_01": 38,
            "bucket_size_log2_02": 2, "clusters": 2, "clustered_docs": 6,
            "cluster_size_log2_01": 1, "cluster_size_log2_02": 1,
            "candidate_edges": 5, "verified_edges": 4,
            "cc_changed_round_001": 3}
  stats = finalize_stats(counts, params)
  docs = {3: ("a", SCRIPT_TEXT), 4: ("b", "plain <i>text</i>"),
          8: (None, "x"), 9: (None, "y")}
  return stats, assemble(
      stats, {"worker_ms_collision": 250, "worker_ms_signatures": 1500},
      [(3, 4), (8, 2)],
      {3: [(3, True, None, False), (4, False, 0.9, False)],
       8: [(8, True, None, False), (9, False, 0.35, True)]},
      {d: (u, f"in/part-{d}.jsonl:{d + 1}", snippet(t))
       for d, (u, t) in docs.items()}, {3: 0.85, 8: 0.35}, 1, 0.4)


def test_rendered_page_is_well_formed_escaped_and_matches_the_stats():
  stats, report = _sample_report()
  assert list(report["worker_seconds"]) == ["signatures", "collision"]
  assert report["largest_clusters"][0]["more"] == 2
  text = render_html(report)
  page = check_page(text)
  check_stat_cells(page, stats)
  shown = "".join(page.text)
  assert snippet(SCRIPT_TEXT) in shown          # the text, as text
  assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in text
  assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text
  assert "… and 2 more." in shown
  assert "Summed worker time per stage" in shown
  # Members by user id, else source:position; the chain flag and minima.
  assert "in/part-8.jsonl:9" in shown and "in/part-3.jsonl:4" not in shown
  clusters = report["largest_clusters"]
  assert [(c["min_jaccard_to_kept"], c["chain"]) for c in clusters] == [
      (0.85, False), (0.35, True)]
  assert 'data-chain="true"' in text and "kept (chain guard)" in shown
  assert page.number("chain_clusters") == 1
  with_wall = render_html(dict(report, wall_seconds=12.5))
  assert check_page(with_wall).stats["wall_seconds"] == "12.5 s"


def _cluster_rows(seed: int, threshold: float):
  """Random clustered rows (tied sizes, clusters larger than the cuts, one
  cluster of which only the kept row is present, as in runs against an
  index) and their summary computed directly."""
  rng = np.random.default_rng(seed)
  ids = iter(rng.permutation(100_000).tolist())
  rows, clusters = [], {}
  for c in range(3 * LARGEST_CLUSTERS):
    size = int(rng.choice([2, 3, 7, 2 * MEMBERS_SHOWN + 5]))
    docs = [next(ids) for _ in range(size)]
    kept = int(rng.choice(docs))
    present = [kept] if c == 0 else docs
    members, lowest = [], None
    for doc in present:
      jaccard = None if doc == kept else float(rng.uniform(0.2, 1.0))
      chain = bool(jaccard is not None and jaccard < threshold)
      rows.append((doc, ClusterInfo(min(docs), size, doc == kept, kept,
                                    jaccard_to_kept=jaccard,
                                    chain_kept=chain)))
      members.append((doc != kept, doc, jaccard, chain))
      if jaccard is not None:
        lowest = jaccard if lowest is None else min(lowest, jaccard)
    clusters[min(docs)] = (size, lowest, sorted(members)[:MEMBERS_SHOWN])
  largest = sorted(clusters, key=lambda c: (-clusters[c][0], c))[
      :LARGEST_CLUSTERS]
  expected = Summary(
      [(c, clusters[c][0]) for c in largest],
      {c: clusters[c][2] for c in largest},
      {c: clusters[c][1] for c in largest if clusters[c][1] is not None},
      sum(low is not None and low < threshold - 1e-9
          for _, low, _ in clusters.values()))
  return rows, expected


@pytest.mark.parametrize("seed", [1, 2])
def test_summary_of_clusters_matches_a_direct_computation(seed):
  rows, expected = _cluster_rows(seed, threshold=0.5)
  assert expected.chains and len(expected.largest) == LARGEST_CLUSTERS
  # The rows in batches of 37 (several per cluster shard), as Explain
  # sends them.
  batches = [cluster_columns(rows[lo:lo + 37]) for lo in range(0, len(rows),
                                                               37)]
  with TestPipeline() as p:
    rows = p | beam.Create(batches, reshuffle=True)
    assert_that(rows | "Default" >> SummarizeClusters(threshold=0.5),
                equal_to([expected]), label="Default")
    # A cluster's rows sent in several lists, from few shards.
    assert_that(rows | "Small" >> SummarizeClusters(threshold=0.5, shards=3,
                                                    max_clusters=2),
                equal_to([expected]), label="Small")


def test_summary_of_no_clusters_is_nothing():
  with TestPipeline() as p:
    summary = (p | beam.Create([], reshuffle=False).with_output_types(
        ClusterColumns) | SummarizeClusters(threshold=0.5))
    assert_that(summary, equal_to([]))


def test_progress_lines_are_throttled_per_stage(monkeypatch):
  lines = []

  class Collect(logging.Handler):

    def emit(self, record):
      lines.append(record.getMessage())

  logger = logging.getLogger(metrics.PROGRESS_LOGGER)
  handler = Collect()
  logger.addHandler(handler)
  level = logger.level
  logger.setLevel(logging.INFO)
  monkeypatch.setattr(metrics, "PROGRESS_INTERVAL_S", 5.0)
  metrics.reset_progress()
  try:
    for t in (0.0, 1.0, 4.9, 5.0, 6.0, 10.5):
      metrics.report_progress("stage_a", "documents", 100, now=1000 + t)
    metrics.report_progress("stage_b", "edges", 7, now=1001.0)
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
    metrics.reset_progress()
  assert lines == ["stage_a: 100 documents processed",
                   "stage_a: 400 documents processed (80/s)",
                   "stage_a: 600 documents processed (57/s)",
                   "stage_b: 7 edges processed"]


def _planted_corpus():
  """Seed-experiment pairs, one cluster of 15 near-copies and one of three
  texts holding markup."""
  texts, _ = seed_corpus(n_base=300, seed=5)
  rng = np.random.default_rng(1)
  base = rng.integers(3000, size=50)
  for _ in range(15):
    copy = base.copy()
    copy[rng.choice(50, size=2, replace=False)] = rng.integers(3000, size=2)
    texts.append(" ".join(f"w{t}" for t in copy))
  texts += [SCRIPT_TEXT] * 3
  return texts


@pytest.mark.e2e
def test_cli_run_writes_a_report_matching_its_outputs(tmp_path, capsys):
  texts = _planted_corpus()
  write_jsonl(tmp_path / "in.jsonl", texts)
  out = str(tmp_path / "out")
  assert main(["--input", str(tmp_path / "in.jsonl"), "--output", out,
               *ARGS]) == 0
  err = capsys.readouterr().err
  # The first report of each stage always shows (totals reset per run).
  for stage in STAGES:
    assert f"neardup {stage}: " in err, (stage, err)

  stats = stats_of(out)
  with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
    report = json.load(f)
  assert report["stats"] == stats
  assert sum(stats["bucket_size_log2"]) == stats["buckets_multi"]
  rows = read_jsonl(os.path.join(out, "clusters", "*.jsonl"))
  by_cluster = {}
  for row in rows:
    by_cluster.setdefault(row["cluster_id"], []).append(row)
  sizes = [len(m) for m in by_cluster.values()]
  assert stats["cluster_size_log2"] == np.bincount(
      metrics.log2_bins(sizes)).tolist()
  expected = sorted(by_cluster, key=lambda c: (-len(by_cluster[c]), c))
  largest = report["largest_clusters"]
  assert [c["cluster_id"] for c in largest] == expected[:LARGEST_CLUSTERS]
  assert largest[0]["size"] == 15 and largest[0]["more"] == 15 - MEMBERS_SHOWN
  for cluster in largest:
    members = {r["doc_id"]: r for r in by_cluster[cluster["cluster_id"]]}
    shown = cluster["members"]
    assert cluster["size"] == len(members)
    assert len(shown) == min(len(members), MEMBERS_SHOWN)
    assert cluster["more"] == len(members) - len(shown)
    assert shown[0]["kept"] and not any(m["kept"] for m in shown[1:])
    for m in shown:
      row = members[m["doc_id"]]
      assert (m["id"], m["kept"]) == (row["id"], row["kept"])
      assert m["snippet"] == snippet(texts[int(row["id"].split("-")[1])])
  assert any(m["snippet"] == snippet(SCRIPT_TEXT)
             for c in largest for m in c["members"])
  assert set(report["worker_seconds"]) <= set(STAGES)
  assert report["wall_seconds"] > 0

  with open(os.path.join(out, "report.html"), encoding="utf-8") as f:
    page = check_page(f.read())
  check_stat_cells(page, stats)
  assert snippet(SCRIPT_TEXT) in "".join(page.text)


def test_counters_carry_progress_histograms_and_timings(tmp_path):
  texts = _planted_corpus()
  write_jsonl(tmp_path / "in.jsonl", texts)
  out = str(tmp_path / "out")
  config = DedupConfig(ngram=3, bands=32, rows=4, threshold=0.4)
  claim_output(out, "counters")
  p = beam.Pipeline(runner="FnApiRunner")
  job.build(p, [str(tmp_path / "in.jsonl")], out, config, run_id="counters")
  result = p.run()
  result.wait_until_finish()
  release_claim(out, "counters")
  counters = {}
  for c in result.metrics().query(
      MetricsFilter().with_namespace(metrics.NAMESPACE))["counters"]:
    counters[c.key.metric.name] = counters.get(c.key.metric.name,
                                               0) + c.committed
  stats = stats_of(out)
  assert counters["signatures_documents"] == len(texts)
  assert counters["band_keys_documents"] == stats["docs_signed"]
  assert counters["collision_band_keys"] == stats["docs_signed"] * 32
  assert counters["selection_clusters"] == stats["clusters"]
  assert counters["writing_documents"] == stats["kept"] + stats["removed"]
  assert counters["verification_candidate_edges"] == stats["candidate_edges"]
  for k, n in enumerate(stats["bucket_size_log2"]):
    assert counters.get(f"bucket_size_log2_{k:02d}", 0) == n
  with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
    report = json.load(f)
  assert counters["worker_ms_signatures"] >= 1
  # The report's timings are the same sums as the counters.
  assert report["worker_seconds"] == {
      stage: counters[metrics.TIMING_PREFIX + stage] / 1000
      for stage in STAGES if metrics.TIMING_PREFIX + stage in counters}


@pytest.mark.e2e
def test_snippets_are_read_back_from_text_and_parquet_inputs(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  base = "red green blue yellow orange purple cyan magenta black white"
  (tmp_path / "a.txt").write_text(
      f"unrelated words in a line\n{base}\n{base.upper()} <b>!</b>\n",
      encoding="utf-8")
  pq.write_table(pa.table({"body": ["one more", base + " grey"],
                           "key": [7, 8]}), tmp_path / "b.parquet")
  out = str(tmp_path / "out")
  assert main(["--input", str(tmp_path / "*"), "--output", out,
               "--text_field", "body", "--id_field", "key",
               "--threshold", "0.5"]) == 0
  with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
    (cluster,) = json.load(f)["largest_clusters"]
  assert [(m["id"], m["kept"], m["snippet"]) for m in cluster["members"]] == [
      (None, True, base), (None, False, base.upper() + " <b>!</b>"),
      (8, False, base + " grey")]


def test_header_names_the_run_and_cluster_list_counts_right():
  stats, report = _sample_report()
  report["run"] = {"inputs": ["in/*.jsonl", "<b>x</b>.parquet"],
                   "version": "9.9.9"}
  report["started_at"] = "2026-12-01 10:00:00 UTC"
  page = Page(render_html(report))
  shown = "".join(page.text)
  header = shown.split("Parameters", 1)[0]
  assert "Inputs: in/*.jsonl, <b>x</b>.parquet" in header
  assert "neardup 9.9.9" in header
  assert f"bands {stats['params']['bands']}" in header
  assert "Started 2026-12-01 10:00:00 UTC" in shown
  # Both clusters of the run are shown: "all", not "the 2 largest (of 20)".
  assert "All 2 clusters, with up to" in shown
  stats["clusters"] = 57
  assert "The 2 largest of the 57 clusters" in "".join(
      Page(render_html(report)).text)
  heads = [t for t, _ in page.tags].count("th")
  assert heads and "<th></th>" not in render_html(report)
  assert 'class="wide"' in render_html(report)
