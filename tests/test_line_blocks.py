"""Reading lines a block at a time (``iter_line_blocks``) gives the rows of
a decompressed stream's own line iteration (and of ``iter_lines``), byte for
byte, whatever the block size, line endings and compression; ``jsonl_texts``
gives the documents and rejections of ``read_file``; ``read_texts`` the
rows asked for.

Examples per property: 200 (NEARDUP_FULL=1: 2,000); derandomized.
"""

import gzip
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transforms import read
from transforms.read import (InputFile, iter_line_blocks, iter_lines,
                             jsonl_texts, open_stream, read_file, read_texts)

FULL = os.environ.get("NEARDUP_FULL") == "1"
PROPERTY = settings(max_examples=2000 if FULL else 200, deadline=None,
                    derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])

# Lines as JSONL files hold them, and what goes wrong in them.
LINES = st.lists(
    st.sampled_from([b'{"text": "a b c", "id": 1}', b'{"text": "x"}',
                     b'{"text": 5}', b"", b"   ", b"[1]", b"{", b"\xff\xfe",
                     b'{"text": "caf\xc3\xa9", "id": 2.5}',
                     b'{"text": "n", "id": NaN}', b"\xef\xbb\xbf{\"text\": \"b\"}",
                     b'{"meta": 1}', b'{"text": "\\ud800"}', b"\r", b"a\rb"])
    | st.binary(max_size=12), max_size=30)
ENDINGS = st.sampled_from([b"\n", b"\r\n"])


def joined(lines, endings, last_ended):
  body = b"".join(line + endings[i % len(endings)]
                  for i, line in enumerate(lines))
  if lines and not last_ended:
    body = body[:-len(endings[(len(lines) - 1) % len(endings)])]
  return body


def raw_lines(path):
  """The file's lines with their endings, as iterating its stream gives."""
  with open_stream(path) as handle:
    return list(handle)


def rows_of_blocks(path, block_bytes):
  rows = []
  for first, block, starts in iter_line_blocks(path, block_bytes):
    assert first == len(rows)
    rows += [block[a:b] for a, b in zip(starts[:-1], starts[1:])]
  return rows


@PROPERTY
@given(LINES, st.lists(ENDINGS, min_size=1, max_size=3), st.booleans(),
       st.integers(1, 40), st.booleans())
def test_blocks_hold_the_raw_lines(tmp_path, lines, endings, last_ended,
                                   block_bytes, compressed):
  path = str(tmp_path / ("a.jsonl.gz" if compressed else "a.jsonl"))
  data = joined(lines, endings, last_ended)
  with (gzip.open(path, "wb") if compressed else open(path, "wb")) as f:
    f.write(data)
  expected = raw_lines(path)
  assert rows_of_blocks(path, block_bytes) == expected
  assert b"".join(expected) == data
  assert [line for _, line in iter_lines(path)] == [
      read.strip_line_end(line) for line in expected]


@PROPERTY
@given(st.binary(max_size=80), st.integers(1, 30))
def test_blocks_of_arbitrary_bytes(tmp_path, data, block_bytes):
  path = str(tmp_path / "a.txt")
  with open(path, "wb") as f:
    f.write(data)
  assert rows_of_blocks(path, block_bytes) == raw_lines(path)


@PROPERTY
@given(LINES, st.lists(ENDINGS, min_size=1, max_size=3), st.booleans(),
       st.integers(1, 60), st.sampled_from([("text", "id"), ("meta", "x")]))
def test_jsonl_texts_are_what_read_file_gives(tmp_path, lines, endings,
                                              last_ended, block_bytes,
                                              fields):
  path = str(tmp_path / "a.jsonl")
  with open(path, "wb") as f:
    f.write(joined(lines, endings, last_ended))
  source = InputFile(3, path, "jsonl", os.path.getsize(path), None)
  documents, rejected = [], []
  for record in read_file(source, *fields):
    if isinstance(record, read.Rejected):
      rejected.append(record)
    else:
      documents.append((record.doc_id, record.text))
  got_documents, got_rejected, rows = [], [], 0
  for ids, texts, rejections, n in jsonl_texts(3, path, *fields,
                                               block_bytes=block_bytes):
    got_documents += zip(ids, texts)
    got_rejected += rejections
    rows += n
  assert got_documents == documents
  assert got_rejected == rejected
  assert rows == len(documents) + len(rejected)


@PROPERTY
@given(st.lists(st.text(max_size=6), min_size=1, max_size=25), st.data())
def test_read_texts_gives_the_rows_asked_for(tmp_path, texts, data):
  path = str(tmp_path / "a.jsonl")
  with open(path, "wb") as f:
    f.write(b"".join(read.orjson.dumps({"text": t, "id": i}) + b"\n"
                     for i, t in enumerate(texts)))
  source = InputFile(0, path, "jsonl", os.path.getsize(path), None)
  rows = data.draw(st.lists(st.integers(0, len(texts) - 1), max_size=30))
  expected = [(r, texts[r]) for r in sorted(set(rows))]
  assert list(read_texts(source, rows, "text")) == expected
  assert list(read_texts(source, rows, "text", "id")) == [
      (r, (t, r)) for r, t in expected]


def test_read_texts_past_the_end_says_the_file_changed(tmp_path):
  path = str(tmp_path / "a.jsonl")
  with open(path, "wb") as f:
    f.write(b'{"text": "a"}\n{"text": "b"}')
  source = InputFile(0, path, "jsonl", os.path.getsize(path), None)
  assert list(read_texts(source, [1], "text")) == [(1, "b")]
  with pytest.raises(read.InputChangedError, match="fewer rows"):
    list(read_texts(source, [1, 2], "text"))
