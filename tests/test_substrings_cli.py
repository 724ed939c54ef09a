"""--substrings end to end through the CLI's main(argv)."""

import glob
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from tests.test_substrings_kernels import oracle
from tests.test_substrings_transforms import narrowed

pytestmark = pytest.mark.e2e

BOILER = ("This message and any attachments are confidential — if you are"
          " not the intended recipient, délétez-le immédiatement. ")


def _rows(folder):
  rows = []
  for path in sorted(glob.glob(f"{folder}/*.jsonl")):
    with open(path, encoding="utf-8") as f:
      rows.extend(json.loads(line) for line in f)
  return rows


def _expected(texts, threshold, strike):
  marks = oracle([t.encode("utf-8") for t in texts], threshold, strike)
  out = []
  for text, mark in zip(texts, marks):
    keep = ~narrowed(text, mark)
    out.append(bytes(np.frombuffer(text.encode("utf-8"), np.uint8)[keep])
               .decode("utf-8"))
  return out


@pytest.mark.parametrize("strike", ["later", "all"])
def test_substrings_alone(tmp_path, strike):
  texts = [f"Note {i}: the meeting moved to room {i * 7}. " + BOILER
           for i in range(6)] + [BOILER, "short unique line", BOILER * 2]
  a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
  lines = [json.dumps({"id": f"d{i}", "text": t, "extra": [i]})
           for i, t in enumerate(texts)]
  a.write_text("\n".join(lines[:5]) + "\n", encoding="utf-8")
  b.write_text("\n".join(lines[5:]) + "\n", encoding="utf-8")
  out = tmp_path / "out"
  assert main(["--input", f"{a},{b}", "--output", str(out), "--near_dup",
               "false", "--substrings", "40", "--substrings_strike",
               strike]) == 0
  want = _expected(texts, 40, strike)
  got = {r["id"]: r for r in _rows(out / "deduped")}
  for i, text in enumerate(want):
    if text:
      assert got[f"d{i}"]["text"] == text and got[f"d{i}"]["extra"] == [i]
    else:
      assert f"d{i}" not in got
  stats = json.loads((out / "stats.json").read_text())
  struck = sum(len(t.encode()) - len(w.encode()) for t, w in zip(texts, want))
  assert stats["substrings_bytes_struck"] == struck > 0
  assert stats["substrings_docs_emptied"] == sum(not w for w in want)
  assert stats["substrings_docs_touched"] == sum(
      w != t for t, w in zip(texts, want))
  report = (out / "report.html").read_text(encoding="utf-8")
  assert "exact substrings: bytes struck" in report
  spans = _rows(out / "substrings")
  assert sum(s["length"] for s in spans) == struck
  if strike == "later":
    assert all((s["first_source"], s["first_position"]) != (
        s["source"], s["position"]) or s["first_start"] < s["start"]
               for s in spans)
    assert {s["first_source"] for s in spans} == {str(a)}


def test_substrings_after_near_dup_on_parquet(tmp_path):
  """After near-dup only the kept documents count: the exact copy that
  near-dup removes is not the first occurrence of its boilerplate."""
  texts = ["alpha beta gamma delta " * 4 + BOILER,
           "alpha beta gamma delta " * 4 + BOILER,
           "something else entirely, other words " + BOILER]
  path = tmp_path / "in.parquet"
  pq.write_table(pa.table({"id": ["x", "y", "z"], "text": texts}), path)
  out = tmp_path / "out"
  assert main(["--input", str(path), "--output", str(out), "--substrings",
               "50"]) == 0
  table = pa.concat_tables(pq.read_table(p) for p in sorted(
      glob.glob(f"{out}/deduped/*.parquet")))
  got = dict(zip(table.column("id").to_pylist(),
                 table.column("text").to_pylist()))
  assert set(got) == {"x", "z"}
  want = _expected([texts[0], texts[2]], 50, "later")
  assert [got["x"], got["z"]] == want and want[1] != texts[2]
