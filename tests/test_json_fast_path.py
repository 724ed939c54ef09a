"""The orjson fast path of JSONL parsing gives exactly what ``json.loads``
gives: every line becomes the same :class:`Document` (text, user id: ints
stay ints, NaN and integers beyond 64 bits are read) or the same
:class:`Rejected` (reason and words) as with the standard library alone,
and so do the texts and ids read back later (``document_fields``,
``json_field``).

Examples per property: 300 (NEARDUP_FULL=1: 3,000); derandomized.
"""

import json
import os
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from transforms import read
from transforms.read import (document_fields, field_value, json_field,
                             parse_json_line)

FULL = os.environ.get("NEARDUP_FULL") == "1"
PROPERTY = settings(max_examples=3000 if FULL else 300, deadline=None,
                    derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def outcome(function, *args):
  """What ``function`` makes of ``args``, comparable across parsers: the
  repr of the result (int vs float, -0.0, NaN), or the error."""
  try:
    return "value", repr(function(*args))
  except RecursionError:
    return "too deep", None
  except ValueError as e:
    return type(e).__name__, str(e)


def standard_library_only():
  """The parsing as it is without orjson."""
  return mock.patch.object(read, "orjson", _Refusing())


class _Refusing:
  """An orjson that refuses every line."""
  JSONDecodeError = read.orjson.JSONDecodeError

  def loads(self, _):
    raise self.JSONDecodeError("refused", "", 0)


def assert_same(line: bytes, text_field="text", id_field="id"):
  def parse():
    return outcome(parse_json_line, 3, "a.jsonl", 0, line, text_field,
                   id_field)

  fast = parse()
  with standard_library_only():
    slow = parse()
  assert fast == slow, line
  if fast[0] == "value" and isinstance(
      parse_json_line(3, "a.jsonl", 0, line, text_field, id_field),
      read.Document):
    decoded = read.line_content(0, line).decode("utf-8")
    with standard_library_only():
      expected = (repr(document_fields(decoded, text_field, id_field)),
                  repr(json_field(decoded, id_field)))
    assert (repr(document_fields(decoded, text_field, id_field)),
            repr(json_field(decoded, id_field))) == expected, line


# Every JSON value the standard library writes, with what orjson refuses
# or reads differently (NaN, Infinity, integers beyond 64 bits, unpaired
# surrogates) mixed in.
SCALARS = (st.none() | st.booleans()
           | st.integers(-2**70, 2**70) | st.integers(-2**64 - 5, 2**64 + 5)
           | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(st.characters() | st.sampled_from("\ud800\udfff\x00")))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12)
FIELDS = st.sampled_from(["text", "id", "meta", "meta.body", "x"])
OBJECTS = st.dictionaries(FIELDS, VALUES | st.dictionaries(
    st.sampled_from(["body", "id"]), VALUES, max_size=2), max_size=4)


def dumped(value, ascii_only: bool) -> bytes:
  return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8",
                                                           "surrogatepass")


@PROPERTY
@given(OBJECTS | VALUES, st.booleans(), st.sampled_from(
    [("text", "id"), ("meta.body", "meta.id"), ("meta", "x")]))
def test_every_dumped_line_reads_the_same(value, ascii_only, fields):
  assert_same(dumped(value, ascii_only), *fields)


@PROPERTY
@given(OBJECTS, st.data())
def test_damaged_lines_read_the_same(value, data):
  line = dumped(value, True)
  at = data.draw(st.integers(0, len(line)))
  cut = data.draw(st.integers(0, 3))
  noise = data.draw(st.binary(max_size=3) | st.sampled_from(
      [b'"', b"{", b"}", b",", b"NaN", b"1" * 20, b"\\ud800", b"\xef\xbb\xbf"]))
  assert_same(line[:at] + noise + line[at + cut:])


@PROPERTY
@given(st.binary(max_size=40))
def test_arbitrary_bytes_read_the_same(line):
  assert_same(line)


@PROPERTY
@given(st.from_regex(r"-?[0-9]{1,25}(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,3})?",
                     fullmatch=True))
def test_numeric_ids_and_texts_read_the_same(number):
  assert_same(b'{"id": %s, "text": "x"}' % number.encode())
  assert_same(b'{"id": "x", "text": %s}' % number.encode())
  assert_same(number.encode())


@pytest.mark.parametrize("body", [
    '"a", "id": 1, "id": 2', '"\\ud800", "id": 1', '"a", "id": "\\udc00"',
    '"a", "id": 1e400', '"a", "id": -1e400', '"a", "id": NaN',
    '"a", "id": -Infinity', '"a", "id": 1.7976931348623159e308',
    '"a", "id": 4.9e-324', '"a", "id": -0', '"a", "id": -0.0',
    '"a", "id": 18446744073709551615', '"a", "id": 18446744073709551616',
    '"a", "id": -9223372036854775808', '"a", "id": -9223372036854775809',
    '"a", "id": [1, 2]', '"a", "id": {"b": 18446744073709551616}',
    '"a", "id": true', '"a", "id": null', '18446744073709551616',
    '"a",', '"a\x01"', '"\u2028"', '"\\ud83d\\ude00"',
    '"a", "n": ' + "[" * 1100 + "]" * 1100])
def test_edge_cases_read_the_same(body):
  assert_same(b'{"text": ' + body.encode() + b"}")
  assert_same(b"\xef\xbb\xbf{\"text\": " + body.encode() + b"}")


def test_rejections_keep_the_standard_library_words():
  bad = parse_json_line(1, "a.jsonl", 0, b'{"text": "x",}', "text", "id")
  with pytest.raises(ValueError) as raised:
    json.loads('{"text": "x",}')
  assert (bad.reason, bad.detail) == ("malformed_json", str(raised.value))
  big = parse_json_line(1, "a.jsonl", 0,
                        b'{"text": "x", "id": 123456789012345678901234}',
                        "text", "id")
  assert big.user_id == 123456789012345678901234
  assert field_value(json.loads('{"a": {"b": 1}}'), "a.b") == (True, 1)
