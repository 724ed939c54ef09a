"""Compressed inputs give compressed outputs of the same kind (or what
--output_compression says), written deterministically."""

import gzip
import json
import os
import zlib

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from transforms import ClusterInfo, WriteResults
from transforms.read import (COMPRESSIONS, InputFile, compression_of,
                             create_stream, make_doc_id,
                             open_stream)
from transforms.select import cluster_columns
from transforms.write import OutputOptions

DATA = b"".join(json.dumps({"id": i, "text": f"text {i} " * (i % 7)}).encode()
                + b"\n" for i in range(2000))


@pytest.mark.parametrize("suffix", sorted(COMPRESSIONS))
def test_every_codec_round_trips_deterministically(tmp_path, suffix):
  paths = [str(tmp_path / f"{name}.jsonl{suffix}") for name in "ab"]
  for path in paths:
    with create_stream(path, suffix) as handle:
      for start in range(0, len(DATA), 4096):
        handle.write(DATA[start:start + 4096])
  with open(paths[0], "rb") as a, open(paths[1], "rb") as b:
    packed = a.read()
    assert packed == b.read() and len(packed) < len(DATA) // 3
  with open_stream(paths[0]) as handle:
    assert handle.read() == DATA


def test_gzip_header_has_no_time_and_no_name(tmp_path):
  path = str(tmp_path / "x.jsonl.gz")
  with create_stream(path, ".gz") as handle:
    handle.write(DATA)
  with open(path, "rb") as f:
    header = f.read(10)
  assert header[:4] == b"\x1f\x8b\x08\x00"  # deflate, no FNAME flag
  assert header[4:8] == b"\x00\x00\x00\x00"  # mtime 0


def test_deflate_is_what_beam_reads_as_deflate(tmp_path):
  path = str(tmp_path / "x.txt.deflate")
  with create_stream(path, ".deflate") as handle:
    handle.write(DATA)
  with open(path, "rb") as f:
    assert zlib.decompress(f.read()) == DATA


def _write(tmp_path, name, data, compression):
  path = str(tmp_path / name)
  with create_stream(path, "." + name.rsplit(".", 1)[1]
                     if compression_of(name) else "") as handle:
    handle.write(data)
  files = [InputFile(0, path, "jsonl", os.path.getsize(path))]
  kept = make_doc_id(0, 0)
  clusters = [(kept, ClusterInfo(kept, 2, True, kept)),
              (make_doc_id(0, 1), ClusterInfo(kept, 2, False, kept))]
  out = str(tmp_path / f"out-{name}-{compression}")
  with TestPipeline(runner="FnApiRunner") as p:
    _ = ({"files": p | "Files" >> beam.Create(files),
          "clusters": p | "Clusters" >> beam.Create(
                [cluster_columns(clusters)]),
          "rejected": p | "Rejected" >> beam.Create([])}
         | WriteResults(out, "id", OutputOptions(compression=compression)))
  return os.listdir(os.path.join(out, "deduped")), out


@pytest.mark.parametrize("name,compression,expected", [
    ("in.jsonl.gz", "auto", "part-00000-00000.jsonl.gz"),
    ("in.jsonl.zstd", "auto", "part-00000-00000.jsonl.zstd"),
    ("in.jsonl.lzma", "auto", "part-00000-00000.jsonl.lzma"),
    ("in.jsonl.gz", "none", "part-00000-00000.jsonl"),
    ("in.jsonl", "auto", "part-00000-00000.jsonl"),
    ("in.jsonl", "bzip2", "part-00000-00000.jsonl.bz2"),
    ("in.jsonl.xz", "gzip", "part-00000-00000.jsonl.gz"),
])
def test_outputs_follow_the_input_or_the_flag(tmp_path, name, compression,
                                             expected):
  original = DATA.splitlines(keepends=True)[:6]
  names, out = _write(tmp_path, name, b"".join(original), compression)
  assert names == [expected]
  with open_stream(os.path.join(out, "deduped", expected)) as handle:
    rows = list(handle)
  assert rows == original[:1] + original[2:]
  if expected.endswith(".lzma"):
    with open(os.path.join(out, "deduped", expected), "rb") as f:
      assert f.read(1) == b"\x5d"  # lzma_alone, as the input
  if expected.endswith(".gz"):
    with gzip.open(os.path.join(out, "deduped", expected)) as f:
      assert f.read().splitlines(keepends=True) == rows
