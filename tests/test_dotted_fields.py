"""Dotted --text_field/--id_field paths into nested JSONL objects: an exact
top-level key wins, a missing step is a ``missing_text_field`` rejection
naming the path, and preflight understands the paths."""

import json
import os

import pytest

from pipeline.preflight import check_inputs
from transforms.read import (Document, InputFile, field_value,
                             parse_json_line, read_texts)
from transforms.write import _json_field


def _parse(obj, text_field="meta.body", id_field="meta.id"):
  return parse_json_line(9, "f.jsonl", 0, json.dumps(obj).encode(),
                         text_field, id_field)


def test_nested_text_and_id_are_read():
  doc = _parse({"meta": {"body": "hello", "id": 7}})
  assert doc == Document(9, "hello", 7, doc.record)
  assert _parse({"meta": {"body": "x"}}).user_id is None


def test_an_exact_top_level_key_wins_over_the_path():
  assert _parse({"meta.body": "flat", "meta": {"body": "nested"}}).text == (
      "flat")
  assert field_value({"a": {"b": {"c": 1}}}, "a.b.c") == (True, 1)
  assert field_value({"a": {"b.c": 1}}, "a.b.c") == (False, None)


@pytest.mark.parametrize("obj,detail", [
    ({"other": 1}, "no 'meta.body' field"),
    ({"meta": {"title": "x"}}, "no 'meta.body' field ('meta' has no 'body')"),
    ({"meta": "text"}, "no 'meta.body' field ('meta' is str, not an object)"),
    ({"meta": [1]}, "no 'meta.body' field ('meta' is list, not an object)"),
])
def test_a_missing_step_is_a_rejection_naming_the_path(obj, detail):
  rejected = _parse(obj)
  assert (rejected.reason, rejected.detail) == ("missing_text_field", detail)


def test_non_string_nested_text_is_rejected():
  rejected = _parse({"meta": {"body": {"x": 1}}})
  assert (rejected.reason, rejected.detail) == ("text_not_string",
                                                "'meta.body' is dict")


def test_verification_and_writer_read_the_same_paths(tmp_path):
  path = tmp_path / "in.jsonl"
  path.write_text("\n".join(json.dumps({"meta": {"body": f"t{i}", "id": i}})
                            for i in range(4)) + "\n")
  source = InputFile(0, str(path), "jsonl", os.path.getsize(path))
  assert list(read_texts(source, [1, 3], "meta.body")) == [(1, "t1"),
                                                           (3, "t3")]
  assert _json_field(b'{"meta": {"id": 5}}', "meta.id") == 5


def test_preflight_understands_dotted_paths(tmp_path):
  path = tmp_path / "in.jsonl"
  path.write_text(json.dumps({"meta": {"body": "x", "lang": "en"}}) + "\n")
  assert check_inputs([str(path)], "auto", "meta.body") == (
      check_inputs([str(path)], "auto", "meta.body")[0], [])
  _, problems = check_inputs([str(path)], "auto", "meta.text")
  assert problems == [
      f"{path}: no record of the first 1 has the field 'meta.text' (fields:"
      " meta, meta.body, meta.lang); pass --text_field with one of them (a"
      " dotted path for a nested one)"]
