"""The benchmark harness (bench/) at tiny size: every system runs, quality
against the planted duplicates is sane, ratios and targets are reported.
No timing assertions: speed is what the harness reports, not what tests
check."""

import json
import shutil

import numpy as np
import pytest

from bench import corpora, jobs
from bench import beam_share
from bench import fixed_cost
from bench import run
from bench import substrings as substrings_bench
from bench import systems

OURS = ("ours-classic", "ours-oph")
PEERS = ("rensa", "rensa-matrix", "datasketch", "seed-numpy", "py-shingles")
E2E = ("ours", "rensa", "datasketch", "seed-numpy")


def test_seed_style_corpus_plants_copies_with_ten_percent_replaced():
  corpus = corpora.seed_style(500, seed=3)
  assert len(corpus.texts) == 500
  assert corpus == corpora.seed_style(500, seed=3)
  assert 80 <= len(corpus.groups) <= 150  # 30% of ~385 originals
  for a, b in corpus.groups:
    x, y = corpus.texts[a].split(), corpus.texts[b].split()
    assert b == a + 1 and len(x) == len(y) == 50
    assert sum(u != v for u, v in zip(x, y)) <= 5


def test_web_like_corpus_shape_and_planted_groups():
  corpus = corpora.web_like(300, seed=5)
  assert len(corpus.texts) == 300
  assert corpus == corpora.web_like(300, seed=5)
  lengths = np.array([len(t.split()) for t in corpus.texts])
  assert 200 < np.median(lengths) < 700 and lengths.max() <= 5000 + 20
  assert any(c in corpus.texts[0] for c in ".?!")
  assert any(w[0].isupper() for w in corpus.texts[0].split())
  assert corpus.groups
  members = [i for g in corpus.groups for i in g]
  assert len(members) == len(set(members))  # groups are disjoint
  sets = systems.shingle_sets(corpus.texts, 5)
  for group in corpus.groups:
    base = sets[group[0]]
    for other in group[1:]:
      # Copies have a few % of words changed (and a header), the other
      # direction of the group likewise: Jaccard well above unrelated text.
      jaccard = len(base & sets[other]) / len(base | sets[other])
      assert jaccard > 0.3


def test_pair_metrics_counts_pairs_inside_clusters():
  groups = [[0, 1, 2], [5, 6]]
  # Cluster {0, 1, 9}: one true pair (0, 1), two false; {5, 6}: one true.
  labels = {0: 0, 1: 0, 9: 0, 5: 5, 6: 5}
  m = systems.pair_metrics(labels, groups, strong_pairs=[(0, 2), (5, 6)])
  assert (m["predicted_pairs"], m["truth_pairs"], m["true_positive_pairs"]
          ) == (4, 4, 2)
  assert m["precision"] == 0.5 and m["recall"] == 0.5
  assert m["pairs_at_threshold"] == 2 and m["recall_at_threshold"] == 0.5
  assert (m["clusters"], m["clustered_docs"]) == (2, 5)


def test_pairs_at_least_keeps_planted_pairs_above_the_threshold():
  texts = ["a b c d e f g h", "a b c d e f g x", "a b c r s t u v",
           "z y"]
  # 3-gram Jaccard: (0, 1) 5/7; (0, 2) and (1, 2) 1/11.
  assert systems.pairs_at_least(texts, [[0, 1, 2]], 3, 0.5) == [(0, 1)]
  assert systems.pairs_at_least(texts, [[0, 1, 2]], 3, 0.05) == [
      (0, 1), (0, 2), (1, 2)]


def test_bands_rows_divide_num_perm_for_every_system():
  for name in run.CORPUS_PARAMS:
    p = run.corpus_params(name, seed=1)
    assert p["bands"] * p["rows"] == jobs.NUM_PERM
  assert run.corpus_params("seed-style", 1)[("bands")] == 32  # the method's


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench") / "results.json"
  code = run.main(["--quick", "--in-process", "--sig-seed", "150",
                   "--sig-web", "40", "--e2e-seed", "600", "--e2e-web", "0",
                   "--scale", "0", "--repeats", "1", "--seed", "7",
                   "--fixed-cost-runs", "1", "--out", str(out)])
  assert code == 0
  with open(out, encoding="utf-8") as f:
    return json.load(f)


def test_harness_measures_every_system_on_both_corpora(tiny_results):
  rows = {(r["corpus"], r["system"]): r for r in tiny_results["signatures"]}
  for corpus in ("seed-style", "web-like"):
    for system in OURS + PEERS:
      r = rows[(corpus, system)]
      assert "error" not in r, r.get("error")
      assert r["docs_per_s"] > 0 and r["mb_per_s"] > 0
  ratios = tiny_results["ratios"]["signatures_docs_per_s_ours_over_peer"]
  for corpus in ("seed-style", "web-like"):
    for ours in OURS:
      for peer in PEERS:
        assert ratios[corpus][f"{ours}/{peer}"] > 0


def test_harness_end_to_end_finds_the_planted_duplicates(tiny_results):
  rows = {r["system"]: r for r in tiny_results["end_to_end"]}
  assert set(rows) == set(E2E)
  for system, r in rows.items():
    assert "error" not in r, r.get("error")
    assert r["docs"] == 600 and r["truth_pairs"] > 100
    assert r["recall"] > 0.5, system
    assert r["recall_at_threshold"] >= r["recall"] - 0.05, system
    assert r["precision"] > 0.5, system
  assert rows["ours"]["stats"]["docs_in"] == 600
  ratios = tiny_results["ratios"]["end_to_end_wall_ours_over_peer"]
  assert set(ratios["seed-style@600"]) == {"ours/rensa", "ours/datasketch",
                                           "ours/seed-numpy"}


def test_harness_evaluates_every_target(tiny_results):
  status = {t["id"]: t["status"] for t in tiny_results["targets"]}
  assert set(status) == {"1a", "1b", "2", "3a", "3b", "4", "12.1", "12.2",
                         "12.3a", "12.3b", "12.4", "12.5", "31.1", "31.2",
                         "31.3", "31.4"}
  for tid in ("1a", "1b", "2", "3a", "3b", "12.1", "12.2", "12.5", "31.1",
              "31.2"):
    assert status[tid] in ("PASS", "FAIL"), tid
  for tid in ("4", "12.3a", "12.3b", "31.4"):  # no --scale run
    assert status[tid] == "SKIP", tid
  assert status["12.4"] == "SKIP"  # no --profile-runs
  report = run.markdown(tiny_results)
  for system in OURS + PEERS:
    assert f"| {system} |" in report
  assert sorted(tiny_results["fixed_cost"]) == ["20", "600"]
  assert "| 600 | this tree |" in report


def _row(system, docs, seconds, corpus="seed-style", rss=100.0, **extra):
  return dict(system=system, docs=docs, seconds=seconds, peak_rss_mb=rss,
              corpus=corpus, **extra)


def test_issue_12_targets_compare_with_rensa_at_both_sizes():
  row = _row
  sizes = {"runners_tiny": 20, "e2e_seed": 100_000}
  e2e = [row("ours", 100_000, 14.0, shuffle_bytes_per_doc=1_071.0),
         row("rensa", 100_000, 10.0)]
  tiny = [dict(row("ours", 20, 2.5), runner=run.DEFAULT_RUNNER)]
  scale = row("ours", 1_000_000, 69.0, rss=3_000.0)
  peers = [row("rensa", 1_000_000, 100.0, rss=8_000.0)]
  got = {t["id"]: (t["status"], t["measured"])
         for t in run.evaluate_issue_12(e2e, scale, peers, tiny, sizes)}
  assert got["12.1"] == ("PASS", 2.5)
  assert got["12.2"] == ("PASS", 1.4)
  assert got["12.3a"] == ("PASS", {"wall": 0.69, "rss": 0.38})
  assert got["12.3b"] == ("PASS", 4.93)
  assert got["12.5"] == ("FAIL", 1_071)
  peers[0]["peak_rss_mb"] = 5_000.0  # ours 0.6x: over the 0.5x bound
  got = {t["id"]: t["status"]
         for t in run.evaluate_issue_12(e2e, scale, peers, tiny, sizes)}
  assert got["12.3a"] == "FAIL"


def test_issue_12_profile_target_takes_the_median_beam_share():
  sizes = {"runners_tiny": 20, "e2e_seed": 100_000}

  def target(profiles):
    [t] = [t for t in run.evaluate_issue_12([], None, [], [], sizes,
                                            profiles=profiles)
           if t["id"] == "12.4"]
    return t["status"], t["measured"]

  def runs(*shares, pickle=0):
    return [{"beam_share": s, "pickle": pickle} for s in shares]

  assert target(runs(28.0, 31.0, 25.04)) == (
      "PASS", {"beam_share": 28.0, "runs": [28.0, 31.0, 25.0],
               "pickle_samples": 0})
  assert target(runs(31.0, 35.0, 20.0))[0] == "FAIL"
  assert target(runs(30.0))[0] == "FAIL"  # the bound is strict
  assert target(runs(28.0, 25.0, pickle=2)) == (
      "FAIL", {"beam_share": 26.5, "runs": [28.0, 25.0], "pickle_samples": 2})
  assert target(runs(20.0) + [{"error": "py-spy failed: denied"}]) == (
      "ERROR", None)
  assert target([]) == ("SKIP", None)
  # Callers from before the profiles: SKIP.
  assert {t["id"]: t["status"] for t in run.evaluate_issue_12(
      [], None, [], [], sizes)}["12.4"] == "SKIP"


# A raw py-spy profile (--format raw --threads): thread;frames outermost
# first;... count. Frames are "function (path:line)".
_BOOT = ("Thread._bootstrap (threading.py:1002);"
         "Thread._bootstrap_inner (threading.py:1045)")
_MAIN = ("thread (100): MainThread;_run_module_as_main (<frozen runpy>:198);"
         "<module> (pipeline/__main__.py:7);main (pipeline/cli.py:88)")
_RUN = (_MAIN + ";Pipeline.run (apache_beam/pipeline.py:563);"
        "FnApiRunner.run_stages (apache_beam/runners/portability/fn_api_runner"
        "/fn_runner.py:465)")
_BUNDLE = (_RUN + ";DataInputOperation.process_encoded"
           " (apache_beam/runners/worker/bundle_processor.py:263)")
_APPLY = _MAIN + ";Pipeline.apply (apache_beam/pipeline.py:700)"
_CODERS = "apache_beam/coders/coders.py"
RAW_PROFILE = [
    # Idle: a wait innermost (under Beam's frames), or only threading,
    # concurrent and queue frames (a thread blocked in C); 10 samples.
    f"thread (101): Thread-1;{_BOOT};PeriodicThread.run"
    " (apache_beam/runners/worker/data_plane.py:259);Event.wait"
    " (threading.py:629);Condition.wait (threading.py:331) 3",
    f"thread (102): ExecutionTreeCreator_0;{_BOOT};Thread.run"
    " (threading.py:982) 4",
    f"thread (103): ExecutionTreeCreator_0;{_BOOT};Thread.run"
    " (threading.py:982);_worker (concurrent/futures/thread.py:81) 1",
    "thread (104);Thread.run (threading.py:982);Queue.get (queue.py:171) 2",
    # Imports, wherever they are: 7.
    "thread (100): MainThread;<module> (pipeline/__main__.py:5);"
    "_find_and_load (<frozen importlib._bootstrap>:1176);<module>"
    " (apache_beam/__init__.py:86) 7",
    # Beam, by phase: construction 5 + 1, stage set-up 1 + 3, grouping 4,
    # data plane 2 + 1 (both PickleCoder), translation 2 + 1, other 1.
    _APPLY + ";get_signature (apache_beam/typehints/decorators.py:100) 5",
    _APPLY + f";PickleCoder._create_impl ({_CODERS}:910) 1",
    _RUN + ";BundleProcessor.__init__"
    " (apache_beam/runners/worker/bundle_processor.py:1176);"
    "ThreadPoolExecutor.submit (concurrent/futures/thread.py:176) 1",
    f"thread (105): ExecutionTreeCreator_0;{_BOOT};Thread.run"
    " (threading.py:982);_WorkItem.run (concurrent/futures/thread.py:58);"
    "BundleProcessor.create_execution_tree"
    " (apache_beam/runners/worker/bundle_processor.py:1205);"
    "PipelineContext.__init__ (apache_beam/runners/pipeline_context.py:180)"
    " 3",
    _BUNDLE + ";DataOutputOperation.finish"
    " (apache_beam/runners/worker/bundle_processor.py:180);"
    "GroupingBuffer.append (apache_beam/runners/portability/fn_api_runner"
    "/execution.py:230) 4",
    _BUNDLE + f";PickleCoder._create_impl.<locals>.<lambda> ({_CODERS}:915)"
    " 2",
    _BUNDLE + f";maybe_dill_loads ({_CODERS}:845) 1",
    _RUN + ";Pipeline.to_runner_api (apache_beam/pipeline.py:950) 2",
    _RUN + ";lift_combiners (apache_beam/runners/portability/fn_api_runner"
    "/translations.py:1000) 1",
    _MAIN + ";PipelineOptions.view_as"
    " (apache_beam/options/pipeline_options.py:400) 1",
    # The project: the innermost of Beam's and the project's frames is the
    # project's (numpy below it counts for the project): 6 + 3.
    _BUNDLE + ";_BatchFn.process (transforms/sign.py:39);signature_batch"
    " (transforms/kernels/compiled_signature.py:79);amax"
    " (numpy/core/fromnumeric.py:2800) 6",
    _APPLY + ";NearDedup.expand (transforms/near_dedup.py:50) 3",
    # Other: the command's entry alone, and no Python frame at all: 2 + 1.
    "thread (100): MainThread;_run_module_as_main (<frozen runpy>:198);"
    "<module> (pipeline/__main__.py:7) 2",
    "thread (100): MainThread 1",
    "",
]


def test_classify_counts_a_raw_profile():
  got = beam_share.classify(RAW_PROFILE)
  assert {k: got[k] for k in ("total", "idle", "beam", "project", "imports",
                              "other", "pickle")} == {
      "total": 40, "idle": 10, "beam": 21, "project": 9, "imports": 7,
      "other": 3, "pickle": 3}
  assert (got["beam_share"], got["project_share"], got["import_share"],
          got["other_share"]) == (52.5, 22.5, 17.5, 7.5)
  assert got["beam_phases"] == {"construction": 6, "stage_setup": 4,
                                "grouping": 4, "data_plane": 3,
                                "translation": 3, "other": 1}
  leaves = got["beam_leaves"]
  assert sum(leaves.values()) == 21
  assert list(leaves.items())[:3] == [
      ("get_signature (apache_beam/typehints/decorators.py)", 5),
      ("GroupingBuffer.append (apache_beam/runners/portability/fn_api_runner"
       "/execution.py)", 4),
      ("PipelineContext.__init__ (apache_beam/runners/pipeline_context.py)",
       3)]
  assert got["idle_by_thread"] == {"ExecutionTreeCreator_0": 5,
                                   "Thread-1": 3, "(104)": 2}


def test_classify_rejects_what_is_not_a_py_spy_threads_line():
  with pytest.raises(ValueError):
    beam_share.classify(["MainThread;main (pipeline/cli.py:88) 3"])
  assert beam_share.classify([])["beam_share"] is None


def test_a_real_profile_adds_up(tmp_path):
  if shutil.which("py-spy") is None:
    pytest.skip("py-spy is not installed (requirements-bench.txt)")
  directory = str(tmp_path / "c")
  corpora.write(corpora.seed_style(20, seed=3), directory)
  argv = run.pipeline_argv(directory, str(tmp_path / "out"),
                           run.corpus_params("seed-style", 3))
  r = beam_share.profile_job(argv, str(tmp_path / "raw.txt"))
  if "error" in r and r["returncode"] != 0:
    pytest.skip(f"py-spy cannot profile here: {r['error']}")
  assert "error" not in r, r["error"]
  assert r["beam"] + r["project"] + r["imports"] + r["other"] == r["total"]
  assert r["total"] > 0
  assert r["thread_cpu_s"]["MainThread"] > 0, r
  assert r["cpus"]["job"] == run.Runner(in_process=False).cpu


def test_a_failed_job_is_an_error_even_beside_an_earlier_success(tmp_path):
  if shutil.which("py-spy") is None:
    pytest.skip("py-spy is not installed (requirements-bench.txt)")
  out = tmp_path / "out"
  out.mkdir()
  (out / "_SUCCESS").write_text("{}")  # an earlier run's
  argv = run.pipeline_argv(str(tmp_path / "c"), str(out),
                           run.corpus_params("seed-style", 3))
  r = beam_share.profile_job(argv + ["--no_such_flag", "1"],
                             str(tmp_path / "raw.txt"))
  if r["returncode"] != 0:
    pytest.skip(f"py-spy cannot profile here: {r['error']}")
  assert r["error"].startswith("the job failed (no new _SUCCESS"), r


def test_a_tiny_run_counts_its_median_of_several():
  runs = [{"seconds": s, "docs": 20} for s in (3.4, 2.1, 9.0, 2.5, 2.2)]
  got = run.median_run(runs)
  assert got["seconds"] == 2.5 and got["seconds_runs"] == [3.4, 2.1, 9.0,
                                                           2.5, 2.2]
  assert "seconds_runs" not in run.median_run(runs[:1])
  failed = {"docs": 20, "error": "pipeline exited with 1"}
  assert run.median_run(runs[:2] + [failed]) == failed


def test_measurement_child_is_pinned_and_reports_its_rss(tmp_path):
  directory = str(tmp_path / "c")
  corpora.write(corpora.seed_style(200, seed=2), directory)
  runner = run.Runner(in_process=False)
  r = runner.measure({"kind": "clusters", "system": "rensa",
                      "corpus": directory, "docs": 200,
                      "params": run.corpus_params("seed-style", 2)})
  assert "error" not in r, r.get("error")
  assert r["cpus"] == [runner.cpu]
  assert r["peak_rss_mb"] >= r["rss_before_mb"] > 0
  assert r["recall"] > 0.5


def test_a_peer_script_writes_the_lines_it_keeps_and_is_timed_whole(
    tmp_path, tiny_results):
  directory = str(tmp_path / "c")
  corpora.write(corpora.seed_style(300, seed=4), directory)
  params = run.corpus_params("seed-style", 4)
  spec = {"kind": "clusters", "system": "rensa", "corpus": directory,
          "docs": 300, "params": params}
  r = run.run_script(run.Runner(in_process=False), spec, str(tmp_path))
  assert "error" not in r, r.get("error")
  assert r["system"] == "rensa script" and r["docs"] == 300
  # The parent's wall holds the child's start, imports and reading too.
  assert r["seconds"] > r["inside_s"] > 0 and r["peak_rss_mb"] > 0
  with open(f"{directory}/corpus.jsonl", "rb") as f:
    lines = f.read().splitlines(keepends=True)
  labels = systems.rensa_clusters(corpora.read(directory).texts, params)
  removed = {i for i, label in labels.items() if label != i}
  assert 0 < len(removed) < 300 and r["kept"] == 300 - len(removed)
  with open(tmp_path / "rensa-script-300.jsonl", "rb") as f:
    assert f.read() == b"".join(line for i, line in enumerate(lines)
                                if i not in removed)
  # A script row has no quality figures; the report still renders it.
  e2e = tiny_results["end_to_end"] + [dict(r, corpus="seed-style", docs=600)]
  ours = next(x for x in e2e if x["system"] == "ours")
  ratios = run.ratios([], e2e)["end_to_end_wall_ours_over_peer"]
  assert ratios["seed-style@600"]["ours/rensa script"] == (
      ours["seconds"] / r["seconds"])
  report = run.markdown(dict(tiny_results, end_to_end=e2e, ratios=dict(
      tiny_results["ratios"], end_to_end_wall_ours_over_peer=ratios)))
  assert "| seed-style | rensa script | 600 |" in report


def test_pipeline_output_gives_pairs_and_shuffle_bytes_per_document(tmp_path):
  (tmp_path / "clusters").mkdir()
  rows = [{"doc_id": 3, "position": 4, "cluster_id": 3},
          {"doc_id": 7, "position": 8, "cluster_id": 3}]
  (tmp_path / "clusters" / "part-00000.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in rows))
  (tmp_path / "stats.json").write_text(json.dumps({
      "docs_in": 10, "kept": 9, "removed": 1, "rejected": 0,
      "shuffle_bytes": {"band_keys": 400, "edges": 100}}))
  out = run.read_pipeline_output(str(tmp_path), [[3, 7], [1, 2]],
                                 strong_pairs=[(3, 7)])
  assert (out["precision"], out["recall"], out["recall_at_threshold"]
          ) == (1.0, 0.5, 1.0)
  assert out["shuffle_bytes_per_doc"] == 50.0
  assert out["shuffle_bytes_per_doc_by_shuffle"] == {"band_keys": 40.0,
                                                     "edges": 10.0}
  assert out["stats"]["removed"] == 1


def test_issue_31_targets_compare_with_rensa_on_both_corpora():
  row = _row
  sizes = {"runners_tiny": 20, "e2e_seed": 100_000, "e2e_web": 100_000}
  e2e = [row("ours", 100_000, 9.0), row("rensa", 100_000, 10.0),
         row("ours", 100_000, 11.0, "web-like"),
         row("rensa", 100_000, 10.0, "web-like")]
  tiny = [dict(row("ours", 20, 1.4), runner=run.DEFAULT_RUNNER)]
  scale = row("ours", 1_000_000, 50.0, rss=3_000.0)
  peers = [row("rensa", 1_000_000, 100.0, rss=8_000.0)]
  got = {t["id"]: (t["status"], t["measured"])
         for t in run.evaluate_issue_31(e2e, scale, peers, tiny, sizes)}
  assert got["31.1"] == ("PASS", 1.4)
  assert got["31.2"] == ("PASS", 0.9)
  assert got["31.3"] == ("FAIL", 1.1)
  assert got["31.4"] == ("FAIL", {"wall": 0.5, "rss": 0.38})
  sizes["e2e_web"] = 0
  got = {t["id"]: t["status"]
         for t in run.evaluate_issue_31(e2e[:2], None, [], [], sizes)}
  assert got == {"31.1": "SKIP", "31.2": "PASS", "31.3": "SKIP",
                 "31.4": "SKIP"}


def test_fixed_cost_phases_add_up_to_the_wall(tmp_path):
  directory = str(tmp_path / "c")
  corpora.write(corpora.seed_style(20, seed=4), directory)
  rows = fixed_cost.breakdown({"this tree": run.ROOT}, directory,
                              run.corpus_params("seed-style", 4), runs=1)
  r = rows["this tree"]
  assert set(r["phases"]) == set(fixed_cost.PHASES)
  assert all(v >= 0 for v in r["phases"].values()), r
  assert sum(r["phases"].values()) == pytest.approx(r["wall"], rel=0.01)
  assert r["phases"]["imports"] > 0 and r["phases"]["work"] > 0
  assert r["phases"]["kernels"] == 0  # 20 documents stay on the pure paths
  (line,) = fixed_cost.table({20: rows})[2:]
  assert line.startswith("| 20 | this tree | ")


def test_streaming_bench_logic_without_a_pipeline():
  # pylint: disable=import-outside-toplevel
  from bench import streaming
  from transforms.config import DedupConfig
  events = streaming.events_of(["a", "b", "c"], batch=2)
  assert events == [("add", [("00000000", "a", 1000), ("00000001", "b", 1010)]),
                    ("wm", 1020), ("add", [("00000002", "c", 1020)]),
                    ("wm", 1030)]
  # A feed of 2,000 documents/s: event times 0.5 ms apart.
  assert streaming.events_of(["a", "b", "c"], batch=3, gap_ms=0.5) == [
      ("add", [("00000000", "a", 1000), ("00000001", "b", 1000.5),
               ("00000002", "c", 1001)]), ("wm", 1001.5)]
  rows = [{"id": "b", "verdict": "duplicate", "of": "a"},
          {"id": "a", "verdict": "kept", "of": None}]
  assert streaming.verdict_digest(rows) == streaming.verdict_digest(rows[::-1])
  assert streaming.verdict_digest(rows) != streaming.verdict_digest(rows[:1])
  assert streaming.shuffle_per_doc({"Buckets": 300, "Admit": 100}, 4) == {
      "Admit": 25.0, "Buckets": 75.0, "total": 100.0}
  assert streaming.ratios({"ours": {"docs_per_s": 10.0},
                           "rensa": {"docs_per_s": 40.0},
                           "broken": {"error": ["x"]}}) == {"ours/rensa": 0.25}
  goals = streaming.goal_1({"ours": {"docs_per_s": 600.0},
                            "cli": {"docs_per_s": 450.0},
                            "flink": {"docs_per_s": 2500.0},
                            "datasketch": {"docs_per_s": 2000.0}})
  assert {k: g["pass"] for k, g in goals.items()} == {
      "ours": False, "cli": False, "flink": True}
  assert goals["ours"]["need"] == 500 and goals["flink"]["need"] == 2000
  # No datasketch figure in the run: nothing can pass.
  assert not streaming.goal_1({"flink": {"docs_per_s": 9e9}})["flink"]["pass"]
  corpus = corpora.seed_style(60, seed=2)
  state = streaming.bucket_state_bytes(
      corpus.texts, DedupConfig(verify="signature", **streaming.CONFIG))
  # Each kept document's signature (512 bytes) at least once, and less than
  # the 18.8 KB a cell per band key took at b = 32.
  assert 512 < state["bucket_bytes_per_kept_doc"] < 18_848


def test_streaming_feed_file_spaces_event_times_by_the_gap(tmp_path):
  # pylint: disable=import-outside-toplevel
  from bench import streaming
  path = streaming._write_feed(["a", "b", "c"], str(tmp_path), 0.5)  # pylint: disable=protected-access
  with open(path, encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  assert [(r["id"], r["text"], r["ts"]) for r in rows] == [
      ("00000000", "a", 1.0), ("00000001", "b", 1.0005),
      ("00000002", "c", 1.001)]


def test_substrings_bench_reads_the_jobs_spans_as_marks(tmp_path):
  """The Beam job's substrings/ rows become marks of the documents back to
  back (the layout of the Rust tool's marks), across files and documents."""
  texts = ["abcdef", "é!", "xyz"]  # 6, 3 and 3 bytes
  folder = tmp_path / "substrings"
  folder.mkdir()
  (folder / "part-0.jsonl").write_text(
      json.dumps({"id": 0, "start": 1, "end": 3}) + "\n"
      + json.dumps({"id": 2, "start": 0, "end": 3}) + "\n")
  (folder / "part-1.jsonl").write_text(
      json.dumps({"id": 1, "start": 0, "end": 2}) + "\n")
  marks = substrings_bench.read_marks(str(folder), texts)
  assert marks.astype(int).tolist() == [0, 1, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1]
