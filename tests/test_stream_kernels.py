"""The streaming bucket kernel and the state coders, without a runner."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.config import ConfigError, DedupConfig, StreamConfig
from transforms.config import parse_duration_ms
from transforms.kernels import stream as sk
from transforms.stream.elements import (Answer, Arrival, BandEntry,
                                        BandEntryCoder, BucketState,
                                        BucketStateCoder, Member, MemberCoder,
                                        Progress, ProgressCoder, Report,
                                        ReportCoder, Signed, SignedCoder,
                                        Verdict, VerdictCoder)

K = 16
WINDOW = 1000


def member(doc_id, ts, sig):
  return Member(doc_id, ts, np.asarray(sig, dtype=np.uint32))


def test_decide_rules():
  a = member("a", 100, [1] * K)
  near = member("b", 200, [1] * (K - 2) + [7, 7])
  far = member("c", 300, [9] * K)
  rep, kind, by, sim = sk.decide(None, a, WINDOW, "signature", 0.8)
  assert (rep, kind, by, sim) == (a, sk.REP, None, 1.0)
  rep, kind, by, sim = sk.decide(a, near, WINDOW, "signature", 0.8)
  assert (rep, kind, by, sim) == (a, sk.MATCH, a, (K - 2) / K)
  assert sk.decide(a, far, WINDOW, "signature", 0.8)[1] == sk.MISS
  assert sk.decide(a, far, WINDOW, "none", 0.8)[1] == sk.MATCH
  # The same document again is told it is the representative.
  assert sk.decide(a, a._replace(signature=a.signature.copy()), WINDOW,
                   "signature", 0.8)[:2] == (a, sk.REP)
  # An earlier document, or one past the window, takes over.
  early = member("0", 50, [1] * K)
  assert sk.decide(a, early, WINDOW, "signature", 0.8)[:2] == (early, sk.REP)
  late = member("z", 100 + WINDOW + 1, [1] * K)
  assert sk.decide(a, late, WINDOW, "signature", 0.8)[:2] == (late, sk.REP)
  # Ties in event time go to the smaller id bytes.
  assert sk.precedes(member("x", 5, [0] * K), member("y", 5, [0] * K))


def test_exact_verification_uses_the_true_jaccard():
  a = Member("a", 0, np.zeros(K, np.uint32), np.arange(10, dtype=np.uint64))
  b = Member("b", 1, np.ones(K, np.uint32), np.arange(2, 12, dtype=np.uint64))
  # 8 shared of 12: 0.667, whatever the signatures say.
  assert sk.compare(a, b, "exact", 0.6) == (True, 8 / 12)
  assert sk.compare(a, b, "exact", 0.7)[0] is False


documents = st.lists(
    st.tuples(st.integers(0, 3000), st.sampled_from("abcdefgh"),
              st.integers(0, 3)),
    min_size=1, max_size=12, unique_by=lambda t: t[1])


def variants(docs):
  """Members whose signatures differ from a base one by ``edits`` entries."""
  out = []
  for ts, doc_id, edits in docs:
    sig = np.zeros(K, dtype=np.uint32)
    sig[:edits] = ord(doc_id)
    out.append(member(doc_id, ts, sig))
  return out


def run_arrival(members):
  rep, told = None, {}
  for m in members:
    rep, kind, by, _ = sk.decide(rep, m, WINDOW, "signature", 0.8)
    told[m.doc_id] = by.doc_id if kind == sk.MATCH else None
  return told


@settings(max_examples=100, deadline=None)
@given(documents, st.randoms())
def test_no_two_documents_drop_each_other_in_any_arrival_order(docs, rnd):
  members = variants(docs)
  rnd.shuffle(members)
  told = run_arrival(members)
  by_id = {m.doc_id: m for m in members}
  for doc_id, of in told.items():
    if of is not None:
      assert told[of] != doc_id
      assert sk.precedes(by_id[of], by_id[doc_id])


@settings(max_examples=100, deadline=None)
@given(documents, st.randoms())
def test_in_order_decisions_do_not_depend_on_arrival_order(docs, rnd):
  members = variants(docs)
  _, first = sk.decide_in_order(None, members, WINDOW, "signature", 0.8)
  rnd.shuffle(members)
  _, second = sk.decide_in_order(None, members, WINDOW, "signature", 0.8)
  summary = [[(m.doc_id, kind, getattr(by, "doc_id", None)) for m, kind, by, _
              in answers] for answers in (first, second)]
  assert summary[0] == summary[1]


def test_coders_round_trip_and_are_compact():
  m = Member("döc-1", -5, np.arange(128, dtype=np.uint32),
             np.array([3, 2**64 - 1], dtype=np.uint64))
  encoded = MemberCoder().encode(m)
  # Format byte, id, time, signature, shingles; nothing pickled.
  assert len(encoded) == 1 + 4 + 6 + 8 + 4 + 512 + 4 + 16
  back = MemberCoder().decode(encoded)
  assert back.doc_id == m.doc_id and back.event_ms == -5
  assert np.array_equal(back.signature, m.signature)
  assert np.array_equal(back.shingles, m.shingles)
  entry = BandEntryCoder().decode(BandEntryCoder().encode(BandEntry(7, m)))
  assert entry.band == 7 and np.array_equal(entry.member.signature,
                                            m.signature)
  signed = Signed(m, np.array([1, 2], np.uint64), "signed", b"rec")
  again = SignedCoder().decode(SignedCoder().encode(signed))
  assert again.status == "signed" and again.record == b"rec"
  assert again.band_keys.tolist() == [1, 2]
  for report in (Report(answer=Answer(3, sk.MATCH, "a", 9, 0.5)),
                 Report(arrival=Arrival(1, 16, "signed", b"x", 2))):
    assert ReportCoder().decode(ReportCoder().encode(report)) == report
  for verdict in (Verdict("b", 2, "duplicate", "band 0", "a", 1, 0.9, b"r"),
                  Verdict("a", 1, "kept", "unique", None, None, None, b"")):
    assert VerdictCoder().decode(VerdictCoder().encode(verdict)) == verdict
  assert MemberCoder().is_deterministic()
  with pytest.raises(ValueError, match="unknown encoding format"):
    MemberCoder().decode(b"\x07" + encoded[1:])


def test_state_cells_round_trip():
  m = Member("r", 4, np.arange(K, dtype=np.uint32))
  for bucket in (BucketState(), BucketState(m, 7, None, 0),
                 BucketState(None, None, 12, 5, (BandEntry(2, m),
                                                 BandEntry(3, m)))):
    back = BucketStateCoder().decode(BucketStateCoder().encode(bucket))
    assert (back.clock, back.settle_at, back.pending) == bucket[1:4]
    assert (back.rep is None) == (bucket.rep is None)
    assert [(e.band, e.member.doc_id) for e in back.waiting] == [
        (e.band, e.member.doc_id) for e in bucket.waiting]
    if bucket.rep is not None:
      assert np.array_equal(back.rep.signature, m.signature)
  for progress in (Progress(), Progress(done=True),
                   Progress(False, Arrival(1, 64, "signed", b"x", 2),
                            (1 << 63) | 5, Answer(63, sk.MATCH, "a", 0, 0.75),
                            Answer(0, sk.LATE, "", 9, 0.0))):
    assert ProgressCoder().decode(ProgressCoder().encode(progress)) == progress


def test_stream_config_validates_and_parses_durations():
  assert parse_duration_ms("7d") == 7 * 86_400_000
  assert parse_duration_ms("1.5h") == 5_400_000
  assert parse_duration_ms("250ms") == 250
  assert parse_duration_ms("10") == 10_000
  for bad in ("", "soon", "-1s", "7 days"):
    with pytest.raises(ConfigError, match="duration"):
      parse_duration_ms(bad)
  dedup = DedupConfig()
  with pytest.raises(ConfigError, match="--mode"):
    StreamConfig(dedup, mode="fast")
  with pytest.raises(ConfigError, match="raise --allowed_lateness"):
    StreamConfig(dedup, settle_ms=5000, allowed_lateness_ms=5000)
  with pytest.raises(ConfigError, match="--dedup_window"):
    StreamConfig(dedup, dedup_window_ms=0)
  with pytest.raises(ConfigError, match="--max_pending"):
    StreamConfig(dedup, max_pending=0)
  config = StreamConfig(dedup)
  assert config.retention_ms == 7 * 86_400_000 + 3_600_000


def test_rejected_messages_keep_the_reason_and_its_detail():
  """The streaming reader's rejections read like the batch ``rejected/``
  rows: the reason code and what exactly was wrong."""
  # pylint: disable=import-outside-toplevel,protected-access
  from transforms.read import parse_record
  from transforms.stream.messages import RawRecord, _ParseFn
  fn = _ParseFn("jsonl", "text", "id", None)
  fn.setup()
  for data in (b'{"text": ', b'{"id": 1}'):
    [out] = list(fn.process(RawRecord("topic", 0, "m1", data)))
    batch = parse_record(data, "jsonl", "topic", 0, "text", "id")
    assert out.value.reason == batch.message
    assert out.value.reason.startswith(batch.reason + ": ") and batch.detail
