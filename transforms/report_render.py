"""The run report as data (``report.json``) and as one self-contained HTML
page (``report.html``: inline CSS and SVG, no script, nothing fetched).

Pure Python (no Beam import): the job assembles and renders the report on a
worker, once (wall time included when the launcher passed its start time).
"""

from __future__ import annotations

import html
import math
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from transforms import stats as stat_names
from transforms.kernels.lsh import collision_probability

LARGEST_CLUSTERS = 20
MEMBERS_SHOWN = 10
SNIPPET_CHARS = 240
S_CURVE_POINTS = 101
STAGES = ("signatures", "band_keys", "collision", "verification",
          "components", "selection", "writing")

_COUNT_ROWS = (
    ("docs_in", "records read (documents + rejected)"),
    ("kept", "kept"),
    ("removed", "removed as near-duplicates"),
    ("rejected", "rejected (bad records)"),
    ("docs_signed", "documents with a signature"),
    ("docs_empty", "documents with no words"),
    ("docs_too_short", "documents shorter than --min_tokens"),
    ("buckets_multi", "LSH buckets with two or more documents"),
    ("buckets_large", "LSH buckets above --exhaustive_bucket_size (not all"
     " pairs compared)"),
    ("clusters", "duplicate clusters (size ≥ 2)"),
    ("clustered_docs", "documents in duplicate clusters"),
    ("chain_docs", "clustered documents below the threshold to the kept one"),
    ("chain_kept", "of those, kept by --chain_guard"),
)


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
  """The text with runs of whitespace collapsed, cut to ``limit`` chars."""
  flat = re.sub(r"\s+", " ", text).strip()
  return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def s_curve(bands: int, rows: int, points: int = S_CURVE_POINTS
            ) -> List[List[float]]:
  """[s, P(candidate)] for s evenly spaced over [0, 1]."""
  s = [i / (points - 1) for i in range(points)]
  p = collision_probability(s, bands, rows)
  return [[round(x, 6), round(float(y), 6)] for x, y in zip(s, p)]


def size_bins(histogram: Sequence[int]) -> List[dict]:
  """Non-empty log2 bins of a stats.json histogram, smallest sizes first."""
  return [{"log2": k, "min": 1 << k, "max": (2 << k) - 1, "count": n}
          for k, n in enumerate(histogram) if n]


def worker_seconds(timings_ms: Mapping[str, int]) -> Dict[str, float]:
  """``worker_ms_<stage>`` sums as seconds, stages in pipeline order."""
  parsed = {name: stat_names.parse_stat(name) for name in timings_ms}
  by_stage = {stat.key: timings_ms[name] for name, stat in parsed.items()
              if stat.kind == stat_names.TIMING}
  order = [s for s in STAGES if s in by_stage] + sorted(
      set(by_stage) - set(STAGES))
  return {stage: round(by_stage[stage] / 1000, 3) for stage in order}


def is_chain(min_to_kept: Optional[float], threshold: float) -> bool:
  """Whether a cluster whose minimum Jaccard to its kept document is
  ``min_to_kept`` (None: no member has one) is held together by a chain:
  that minimum is below ``threshold``."""
  return min_to_kept is not None and min_to_kept < threshold - 1e-9


def assemble(stats: dict, timings_ms: Mapping[str, int],
             largest: Iterable[Tuple[int, int]],
             members: Mapping[int, Iterable[tuple]],
             documents: Mapping[int, Tuple[object, str, str]],
             min_to_kept: Mapping[int, float] = None, chain_clusters: int = 0,
             threshold: float = 1.0) -> dict:
  """The report document.

  ``largest``: ``(cluster_id, size)`` of the largest clusters, largest first;
  ``members``: per cluster id, the shown ``(doc_id, kept, jaccard_to_kept,
  chain_kept)`` (``kept``: the cluster's kept document); ``documents``:
  ``doc_id -> (user id, source:position, snippet)`` for every shown member;
  ``min_to_kept``: per cluster id, the minimum exact Jaccard of a member to
  the kept document; ``chain_clusters``: how many clusters have a minimum
  below ``threshold`` (held together by chains).
  """
  params = stats["params"]
  min_to_kept = min_to_kept or {}
  clusters = []
  for cluster_id, size in largest:
    shown = [{"doc_id": doc_id, "id": documents[doc_id][0],
              "where": documents[doc_id][1], "kept": kept,
              "jaccard_to_kept": similarity, "chain_kept": chain_kept,
              "snippet": documents[doc_id][2]}
             for doc_id, kept, similarity, chain_kept in members.get(
                 cluster_id, ())]
    lowest = min_to_kept.get(cluster_id)
    clusters.append({"cluster_id": cluster_id, "size": size,
                     "min_jaccard_to_kept": lowest,
                     "chain": is_chain(lowest, threshold),
                     "members": shown, "more": size - len(shown)})
  return {
      "stats": stats,
      "chain_clusters": chain_clusters,
      "s_curve": {
          "bands": params["bands"], "rows": params["rows"],
          "threshold": params["threshold"],
          "lsh_threshold": params["lsh_threshold"],
          "p_at_threshold": round(float(collision_probability(
              params["threshold"], params["bands"], params["rows"])), 6),
          "points": s_curve(params["bands"], params["rows"]),
      },
      "bucket_sizes": size_bins(stats.get("bucket_size_log2", [])),
      "cluster_sizes": size_bins(stats.get("cluster_size_log2", [])),
      "largest_clusters": clusters,
      "worker_seconds": worker_seconds(timings_ms),
      "limits": {"largest_clusters": LARGEST_CLUSTERS,
                 "members_shown": MEMBERS_SHOWN,
                 "snippet_chars": SNIPPET_CHARS},
  }


# --- HTML ---------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;
 color:#1d2330;background:#f6f7f9}
main{max-width:1040px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:0 0 10px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;
 padding:16px 20px;margin:16px 0}
table{border-collapse:collapse}td,th{padding:3px 10px;text-align:left;
 border-bottom:1px solid #eceff3;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#5a6272;font-size:12.5px}.ok{color:#1a7f37}.bad{color:#b42318}
td.id{white-space:nowrap}
.snip{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;
 white-space:pre-wrap;word-break:break-word}
details{margin:8px 0}summary{cursor:pointer;font-weight:600}
svg text{font:11px system-ui,sans-serif;fill:#1d2330}
svg.wide{width:100%;height:auto}
header code{font-size:12.5px}
.grid{display:flex;flex-wrap:wrap;gap:16px}
"""


def _e(value) -> str:
  return html.escape(str(value), quote=True)


def _n(value) -> str:
  return f"{value:,}" if isinstance(value, int) else _e(value)


def _stat_cell(name: str, value) -> str:
  return f'<td class="n" data-stat="{_e(name)}">{_n(value)}</td>'


def _section(anchor: str, title: str, body: str) -> str:
  return (f'<section id="{anchor}"><h2>{_e(title)}</h2>\n{body}\n'
          '</section>\n')


def _table(rows: Iterable[str], head: str = "") -> str:
  head = f"<thead>{head}</thead>" if head else ""
  return f"<table>{head}<tbody>{''.join(rows)}</tbody></table>"


def _line_chart(points, marks, width=990, height=380) -> str:
  """S-curve: polyline of ``points`` in [0,1]^2 plus vertical ``marks``
  (x, label, colour, dashed), labelled in a legend below the axis."""
  left, right, top, bottom = 48, 16, 12, 40
  w, h = width - left - right, height - top - bottom
  height += 18 * len(marks)

  def x(v):
    return left + v * w

  def y(v):
    return top + (1 - v) * h

  # Scales with the section (class "wide"): the viewBox keeps its shape.
  parts = [f'<svg role="img" class="wide" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}">',
           '<title>P(candidate) against Jaccard similarity</title>']
  for i in range(6):
    t = i / 5
    parts.append(f'<line x1="{x(0):.1f}" y1="{y(t):.1f}" x2="{x(1):.1f}" '
                 f'y2="{y(t):.1f}" stroke="#eceff3"/>')
    parts.append(f'<text x="{left - 6}" y="{y(t) + 4:.1f}" '
                 f'text-anchor="end">{t:.1f}</text>')
    parts.append(f'<text x="{x(t):.1f}" y="{top + h + 16}" '
                 f'text-anchor="middle">{t:.1f}</text>')
  parts.append(f'<text x="{left + w / 2:.1f}" y="{top + h + 30}" '
               'text-anchor="middle">Jaccard similarity s</text>')
  parts.append(f'<text x="12" y="{top + h / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 12 {top + h / 2:.1f})">'
               'P(candidate)</text>')
  parts.append(f'<rect x="{left}" y="{top}" width="{w}" height="{h}" '
               'fill="none" stroke="#9aa3b2"/>')
  line = " ".join(f"{x(s):.1f},{y(p):.1f}" for s, p in points)
  parts.append(f'<polyline points="{line}" fill="none" stroke="#2f6fdb" '
               'stroke-width="2"/>')
  for i, (at, label, colour, dashed) in enumerate(marks):
    dash = ' stroke-dasharray="5 4"' if dashed else ""
    parts.append(f'<line x1="{x(at):.1f}" y1="{y(0):.1f}" x2="{x(at):.1f}" '
                 f'y2="{y(1):.1f}" stroke="{colour}"{dash}/>')
    ly = top + h + 46 + 18 * i
    parts.append(f'<line x1="{left}" y1="{ly - 4}" x2="{left + 24}" '
                 f'y2="{ly - 4}" stroke="{colour}"{dash}/>')
    parts.append(f'<text x="{left + 30}" y="{ly}" style="fill:{colour}">'
                 f'{_e(label)}</text>')
  parts.append("</svg>")
  return "\n".join(parts)


def _bar_chart(bars: Sequence[Tuple[str, float, str]], title: str,
               log_scale: bool, width=560, height=240) -> str:
  """Vertical bars ``(label, value, value text)``; heights proportional to
  log10(1 + value) when ``log_scale``."""
  left, right, top, bottom = 12, 12, 22, 44
  w, h = width - left - right, height - top - bottom
  scale = (lambda v: math.log10(1 + v)) if log_scale else (lambda v: v)
  peak = max((scale(v) for _, v, _ in bars), default=0) or 1
  slot = w / max(len(bars), 1)
  bar = max(min(slot * 0.7, 60), 2)
  parts = [f'<svg role="img" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}">', f"<title>{_e(title)}</title>",
           f'<line x1="{left}" y1="{top + h}" x2="{left + w}" '
           f'y2="{top + h}" stroke="#9aa3b2"/>']
  for i, (label, value, text) in enumerate(bars):
    bh = h * scale(value) / peak
    cx = left + slot * (i + 0.5)
    parts.append(f'<rect x="{cx - bar / 2:.1f}" y="{top + h - bh:.1f}" '
                 f'width="{bar:.1f}" height="{bh:.1f}" fill="#2f6fdb">'
                 f"<title>{_e(label)}: {_e(text)}</title></rect>")
    parts.append(f'<text x="{cx:.1f}" y="{top + h - bh - 5:.1f}" '
                 f'text-anchor="middle">{_e(text)}</text>')
    parts.append(f'<text x="{cx:.1f}" y="{top + h + 15}" '
                 f'text-anchor="middle">{_e(label)}</text>')
  parts.append("</svg>")
  return "\n".join(parts)


def _size_label(b: dict) -> str:
  return str(b["min"]) if b["min"] == b["max"] else f"{b['min']}–{b['max']}"


def _histogram(bins: List[dict], what: str, stat: str) -> str:
  if not bins:
    return f'<p class="note">No {what} of two or more documents.</p>'
  chart = _bar_chart([(_size_label(b), b["count"], f"{b['count']:,}")
                      for b in bins], f"{what} by size (log2 bins)",
                     log_scale=True)
  rows = [f"<tr><td>{_e(_size_label(b))}</td>"
          f'<td class="n" data-stat="{stat}_{b["log2"]:02d}">'
          f"{b['count']:,}</td></tr>" for b in bins]
  return (f'<div class="grid"><div>{chart}</div><div>'
          f"{_table(rows, f'<tr><th>size</th><th>{_e(what)}</th></tr>')}"
          "</div></div>\n<p class=\"note\">Bins double in width (log2); "
          "bar heights are on a log scale, the numbers are exact.</p>")


def _parameters(params: dict) -> str:
  rows = [f"<tr><th>{_e(k)}</th><td data-param=\"{_e(k)}\">{_e(v)}</td></tr>"
          for k, v in params.items()]
  return _table(rows)


# Exact-substring counts, in runs with --substrings (transforms.substrings).
_SUBSTRING_ROWS = (
    ("substrings_bytes_struck", "exact substrings: bytes struck"),
    ("substrings_docs_touched", "exact substrings: documents touched"),
    ("substrings_docs_emptied",
     "exact substrings: documents struck to nothing (not in deduped/)"))


def _counts(stats: dict) -> str:
  rows = [f"<tr><td>{_e(label)}</td>{_stat_cell(name, stats.get(name, 0))}"
          "</tr>" for name, label in _COUNT_ROWS]
  rows += [f"<tr><td>{_e(label)}</td>{_stat_cell(name, stats[name])}</tr>"
           for name, label in _SUBSTRING_ROWS if name in stats]
  for reason, n in sorted(stats.get("rejected_by_reason", {}).items()):
    rows.append(f"<tr><td>rejected: {_e(reason)}</td>"
                f"{_stat_cell('rejected_' + reason, n)}</tr>")
  state = ("ok", "balanced: kept + removed + rejected = records read") if (
      stats.get("balanced")) else ("bad", "NOT balanced")
  return (_table(rows) +
          f'\n<p class="{state[0]}">{_e(state[1])}</p>')


def _curve(curve: dict) -> str:
  marks = [(curve["threshold"], f"threshold {curve['threshold']:.2f}: "
            f"P(candidate) = {curve['p_at_threshold']:.3f}", "#b42318",
            False),
           (curve["lsh_threshold"], "S-curve midpoint (1/b)^(1/r) ≈ "
            f"{curve['lsh_threshold']:.3f}", "#7a5af8", True)]
  return (_line_chart(curve["points"], marks) +
          f"\n<p>P(candidate) = 1 − (1 − s<sup>r</sup>)<sup>b</sup> with "
          f'b = <span data-param="bands">{curve["bands"]}</span> bands of '
          f'r = <span data-param="rows">{curve["rows"]}</span> rows: the '
          "chance that a pair of Jaccard similarity s shares at least one "
          "band and so becomes a candidate.</p>")


def _edges(stats: dict) -> str:
  candidates, verified = stats["candidate_edges"], stats["verified_edges"]
  share = f"{verified / candidates:.1%}" if candidates else "–"
  rows = [f"<tr><td>candidate edges (pairs verified: those of small buckets, the compared ones of large buckets)</td>"
          f"{_stat_cell('candidate_edges', candidates)}</tr>",
          f"<tr><td>verified edges (passed verify="
          f"{_e(stats['params'].get('verify'))})</td>"
          f"{_stat_cell('verified_edges', verified)}</tr>",
          "<tr><td>graph edges (spanning forest of the verified edges)</td>"
          f"{_stat_cell('graph_edges', stats.get('graph_edges', 0))}</tr>",
          f'<tr><td>share verified</td><td class="n">{share}</td></tr>']
  return _table(rows)


def _components(stats: dict) -> str:
  changes = stats["cc_changes_per_round"]
  used = stats["cc_rounds_used"]
  rows = [f"<tr><td>rounds used (of {len(changes)})</td>"
          f"{_stat_cell('cc_rounds_used', used)}</tr>",
          f"<tr><td>converged</td><td data-stat=\"cc_converged\">"
          f"{'yes' if stats['cc_converged'] else 'no'}</td></tr>",
          "<tr><td>residual edges resolved by union-find</td>"
          f"{_stat_cell('cc_residual_edges', stats['cc_residual_edges'])}"
          "</tr>",
          "<tr><td>residual nodes resolved by union-find</td>"
          f"{_stat_cell('cc_residual_nodes', stats['cc_residual_nodes'])}"
          "</tr>"]
  shown = changes[:max(used, 1)]
  round_rows = [f"<tr><td>{i}</td>{_stat_cell(stat_names.round_stat(i), c)}"
                "</tr>" for i, c in enumerate(shown, 1)]
  return (_table(rows) + "\n<h3>Edges re-pointed per round</h3>\n" +
          _table(round_rows, "<tr><th>round</th><th>edges</th></tr>") +
          f'\n<p class="note">{len(changes) - len(shown)} later rounds '
          "changed nothing.</p>")


def _run_line(run: dict, params: dict) -> str:
  """Which inputs, which version and the parameters that decide the result
  (the full list is under Parameters)."""
  parts = []
  if run.get("inputs"):
    parts.append("Inputs: " + ", ".join(f"<code>{_e(p)}</code>"
                                        for p in run["inputs"]))
  if run.get("version"):
    parts.append(f"neardup {_e(run['version'])}")
  shown = [(label, params[name]) for name, label in _RUN_PARAMS
           if name in params]
  if shown:
    parts.append(", ".join(f"{label} {_e(value)}" for label, value in shown))
  return (f'<p class="note">{" · ".join(parts)} (all of them under '
          "Parameters).</p>")


_RUN_PARAMS = (("shingle_unit", "shingles"), ("ngram", "n"),
               ("num_perm", "K"), ("bands", "bands"), ("rows", "rows"),
               ("threshold", "threshold"), ("verify", "verify"),
               ("seed", "seed"))


def _timings(seconds: Dict[str, float], wall, started_at=None) -> str:
  parts = []
  if started_at is not None:
    parts.append(f'<p>Started <b data-stat="started_at">{_e(started_at)}'
                 "</b>.</p>")
  if wall is not None:
    parts.append(f'<p>Job wall time: <b data-stat="wall_seconds">'
                 f"{wall:,.1f} s</b> (from the launch to this report).</p>")
  if not seconds:
    parts.append('<p class="note">No stage took a whole millisecond.</p>')
    return "\n".join(parts)
  parts.append(_bar_chart([(stage, s, f"{s:,.2f} s")
                           for stage, s in seconds.items()],
                          "summed worker seconds per stage", log_scale=False,
                          width=620))
  rows = [f"<tr><td>{_e(stage)}</td><td class=\"n\" "
          f'data-stage="{_e(stage)}">{s:,.3f}</td></tr>'
          for stage, s in seconds.items()]
  parts.append(_table(rows, "<tr><th>stage</th><th>worker s</th></tr>"))
  parts.append('<p class="note">Summed worker time per stage: elapsed time '
               "inside each stage's heavy DoFns, added up over all workers "
               "and threads. It is not wall-clock time and leaves out "
               "shuffles, reading and Beam overhead between steps; compare "
               "stages with each other, not with the wall time.</p>")
  return "\n".join(parts)


def _clusters(clusters: List[dict], limits: dict, total: int) -> str:
  if not clusters:
    return '<p class="note">No duplicate clusters.</p>'
  which = (f"All {total:,} clusters" if len(clusters) >= total else
           f"The {len(clusters):,} largest of the {total:,} clusters")
  out = [f'<p class="note">{which}, with up to '
         
         f"{limits['members_shown']} members each (the kept one first, then "
         "by doc id; named by user id, else source:position) and the first "
         f"{limits['snippet_chars']} characters of each text. A cluster "
         "marked <b>chain</b> has a member whose exact Jaccard to the kept "
         "document is below the threshold: it is held together by a chain "
         "of similar pairs (see --chain_guard).</p>"]
  for i, c in enumerate(clusters):
    rows = [f"<tr><td class=\"id\">{_e(_member_name(m))}</td>"
            f"<td>{_member_role(m)}</td>"
            f'<td class="n">{_similarity(m.get("jaccard_to_kept"))}</td>'
            f'<td class="snip">{_e(m["snippet"])}</td></tr>'
            for m in c["members"]]
    more = (f'<p class="note">… and {c["more"]:,} more.</p>'
            if c["more"] else "")
    lowest = c.get("min_jaccard_to_kept")
    chain = (' · <b class="bad">chain</b>' if c.get("chain") else "")
    chain_attr = "true" if c.get("chain") else "false"
    out.append(
        f'<details{" open" if i < 5 else ""} data-cluster="{c["cluster_id"]}"'
        f' data-size="{c["size"]}" data-chain="{chain_attr}">'
        f"<summary>cluster of {c['size']:,} documents · minimum Jaccard to "
        f"the kept one {_similarity(lowest)}{chain}</summary>"
        + _table(rows, "<tr><th>document</th><th>verdict</th><th>Jaccard to kept"
                 "</th><th>text</th></tr>") + more + "</details>")
  return "\n".join(out)


def _member_name(member: dict) -> str:
  """The user id, or ``source:position`` when there is none."""
  return str(member["id"]) if member.get("id") is not None else member.get(
      "where", "")


def _member_role(member: dict) -> str:
  if member["kept"]:
    return "kept"
  return "kept (chain guard)" if member.get("chain_kept") else "removed"


def _similarity(value) -> str:
  return "–" if value is None else f"{value:.3f}"


def render_html(report: dict) -> str:
  """The report as one HTML page; every value from the data is escaped."""
  stats = report["stats"]
  body = [
      "<header><h1>Near-duplicate run report</h1>"
      + _run_line(report.get("run", {}), stats["params"]) +
      f'<p class="note">{stats["docs_in"]:,} records in, '
      f"{stats['removed']:,} removed as near-duplicates in "
      f"{stats['clusters']:,} clusters, "
      f'<span data-stat="chain_clusters">{report.get("chain_clusters", 0):,}'
      "</span> of them held together by chains.</p></header>",
      _section("parameters", "Parameters", _parameters(stats["params"])),
      _section("counts", "Counts", _counts(stats)),
      _section("s-curve", "LSH S-curve", _curve(report["s_curve"])),
      _section("bucket-sizes", "LSH bucket sizes",
               _histogram(report["bucket_sizes"], "buckets",
                          "bucket_size_log2")),
      _section("cluster-sizes", "Cluster sizes",
               _histogram(report["cluster_sizes"], "clusters",
                          "cluster_size_log2")),
      _section("edges", "Edges", _edges(stats)),
      _section("components", "Connected components", _components(stats)),
      _section("timings", "Stage timings",
               _timings(report["worker_seconds"],
                        report.get("wall_seconds"),
                        report.get("started_at"))),
      _section("largest-clusters", "Largest clusters",
               _clusters(report["largest_clusters"], report["limits"],
                         stats["clusters"])),
  ]
  return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<meta name=\"viewport\" content=\"width=device-width\">"
          "<title>neardup run report</title>"
          f"<style>{_CSS}</style></head>\n<body><main>\n" + "\n".join(body) +
          "</main></body></html>\n")
