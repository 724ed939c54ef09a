"""The streaming bucket kernel and the state coders, without a runner."""

import apache_beam as beam
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.config import ConfigError, DedupConfig, StreamConfig
from transforms.config import parse_duration_ms
from transforms.kernels import stream as sk
from transforms.kernels import stream_shard as ss
from transforms.stream.elements import (Answer, Arrival, DueIndexCoder,
                                        Member, MemberCoder,
                                        MemberTableCoder, Progress,
                                        ProgressBatch, ProgressBatchCoder,
                                        ProgressCoder, ShardEntries,
                                        ShardEntriesCoder, ShardStateCoder,
                                        Signed, SignedCoder, Verdict,
                                        VerdictCoder)

K = 16
WINDOW = 1000
PARAMS = ss.Params(event_time=True, settle_ms=100, window_ms=WINDOW,
                   lateness_ms=300, retention_ms=WINDOW + 300, max_pending=3,
                   verify="signature", threshold=0.8, tick_ms=25)


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
  # Format byte, id, time, signature, shingles (each array padded to 8
  # bytes from the start: 1 + 4 here); nothing pickled.
  assert len(encoded) == 1 + 4 + 6 + 8 + 4 + 1 + 512 + 4 + 4 + 16
  # Format 1 (before the padding) is still read.
  legacy = b"".join([b"\x01", encoded[1:23], encoded[24:540],
                     encoded[544:]])
  for data in (encoded, legacy):
    back = MemberCoder().decode(data)
    assert back.doc_id == m.doc_id and back.event_ms == -5
    assert np.array_equal(back.signature, m.signature)
    assert np.array_equal(back.shingles, m.shingles)
  state = ss.empty_state()._replace(keys=np.arange(5, dtype=np.uint64))
  views = ShardStateCoder().decode(ShardStateCoder().encode(state))
  assert views.keys.flags.aligned and not views.keys.flags.owndata
  back = MemberCoder().decode(encoded)
  assert back.doc_id == m.doc_id and back.event_ms == -5
  assert np.array_equal(back.signature, m.signature)
  assert np.array_equal(back.shingles, m.shingles)
  signed = Signed(m, np.array([1, 2], np.uint64), "signed", b"rec")
  again = SignedCoder().decode(SignedCoder().encode(signed))
  assert again.status == "signed" and again.record == b"rec"
  assert again.band_keys.tolist() == [1, 2]
  batch = ProgressBatch(("a", "b"), (
      Progress(bands=5, best=Answer(3, sk.MATCH, "a", 9, 0.5)),
      Progress(arrival=Arrival(1, 16, "signed", b"x", 2))))
  assert ProgressBatchCoder().decode(ProgressBatchCoder().encode(batch)) == (
      batch)
  for verdict in (Verdict("b", 2, "duplicate", "band 0", "a", 1, 0.9, b"r"),
                  Verdict("a", 1, "kept", "unique", None, None, None, b"")):
    assert VerdictCoder().decode(VerdictCoder().encode(verdict)) == verdict
  assert MemberCoder().is_deterministic()
  with pytest.raises(ValueError, match="unknown encoding format"):
    MemberCoder().decode(b"\x07" + encoded[1:])


def table(*members):
  return ss.member_table([m.doc_id for m in members],
                         [m.event_ms for m in members],
                         np.stack([m.signature for m in members]),
                         [m.shingles for m in members])


def assert_tables_equal(a, b):
  assert [a.doc_id(i) for i in range(len(a))] == [
      b.doc_id(i) for i in range(len(b))]
  for x, y in zip(a[1:], b[1:]):
    assert np.array_equal(x, y)


def test_state_cells_round_trip():
  m = Member("r", 4, np.arange(K, dtype=np.uint32))
  x = Member("xé", 5, np.ones(K, dtype=np.uint32),
             np.array([1, 9], np.uint64))
  members = table(m, x)
  back = MemberTableCoder().decode(MemberTableCoder().encode(members))
  assert_tables_equal(back, members)
  assert_tables_equal(ss.take_members(members, np.array([1])), table(x))
  entries = ShardEntries(np.array([3, 2**64 - 1], np.uint64),
                         np.array([0, 5]), np.array([1, 0]), members)
  again = ShardEntriesCoder().decode(ShardEntriesCoder().encode(entries))
  assert again.keys.tolist() == [3, 2**64 - 1]
  assert again.rows.tolist() == [1, 0]
  assert_tables_equal(again.members, members)
  shard = ss.Shard(ss.empty_state(), ss.empty_members(K), PARAMS)
  shard.add(entries.keys, entries.bands, entries.rows, members)
  state = shard.state()
  decoded = ShardStateCoder().decode(ShardStateCoder().encode(state))
  assert all(np.array_equal(a, b) for a, b in zip(decoded, state))
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


def _run_shard(steps, params, keys_of=None):
  """Answers and final representatives of one Shard fed ``steps`` (``("add",
  [(key, doc_id, ts, sig)])`` or ``("fire", until)``), through a coder
  round trip after every step, as a runner would."""
  state, members = ss.empty_state(), ss.empty_members(K)
  answers = []
  for kind, value in steps:
    shard = ss.Shard(state, members, params)
    if kind == "add":
      rows = [r for r in value if keys_of is None or r[0] in keys_of]
      if not rows:
        continue
      shard.add(np.array([r[0] for r in rows], np.uint64),
                np.array([r[0] % 7 for r in rows], np.int64),
                np.arange(len(rows)),
                table(*[member(r[1], r[2], r[3]) for r in rows]))
    else:
      shard.fire(value)
    answers += shard.answers
    state = ShardStateCoder().decode(ShardStateCoder().encode(shard.state()))
    members = MemberTableCoder().decode(MemberTableCoder().encode(
        shard.table))
  reps = {int(k): members.doc_id(int(r))
          for k, r in zip(state.keys, state.rep) if r >= 0}
  return sorted(answers), reps, state


def shard_steps_of(keys: int, rows: int, steps: int):
  """Steps of a shard: adds of up to ``rows`` entries (band keys 1 to
  ``keys``) and fires, up to ``steps`` of them."""
  return st.lists(st.one_of(
      st.tuples(st.just("add"), st.lists(st.tuples(
          st.integers(1, keys), st.sampled_from("abcdefghij"),
          st.integers(0, 2000), st.integers(0, 3)), min_size=1,
                                         max_size=rows)),
      st.tuples(st.just("fire"), st.integers(0, 6000))), min_size=1,
                  max_size=steps)


shard_steps = shard_steps_of(4, 6, 10)


def _steps(raw):
  steps, seen = [], set()
  for kind, value in raw:
    if kind == "fire":
      steps.append((kind, value))
      continue
    rows = []
    for key, doc, ts, edits in value:
      if (key, doc) in seen:  # a document once per bucket (Admit's job)
        continue
      seen.add((key, doc))
      sig = np.zeros(K, np.uint32)
      sig[:edits] = ord(doc)
      rows.append((key, doc, ts + ord(doc), sig))
    steps.append(("add", rows))
  return steps


@settings(max_examples=150, deadline=None)
@given(shard_steps, st.sampled_from([True, False]),
       st.sampled_from([1, 25, 200]))
def test_a_shard_answers_as_its_buckets_would_alone(raw, event_time,
                                                    expire_tick):
  """Buckets sharing a shard do not see each other: a shard of four band
  keys gives each key the answers and representative that a shard of that
  key alone gives it."""
  params = PARAMS._replace(event_time=event_time, expire_tick_ms=expire_tick)
  steps = _steps(raw)
  together, reps, _ = _run_shard(steps, params)
  alone, alone_reps = [], {}
  for key in range(1, 5):
    answers, key_reps, _ = _run_shard(steps, params, keys_of={key})
    alone += answers
    alone_reps.update(key_reps)
  assert together == sorted(alone)
  assert reps == alone_reps


@settings(max_examples=150, deadline=None)
@given(shard_steps, st.sampled_from([True, False]),
       st.sampled_from([1, 25, 200]))
def test_one_late_tick_fires_what_every_timer_on_time_would(raw, event_time,
                                                            expire_tick):
  """Firing once at T decides exactly what firing at every armed bucket
  timer up to T, one after the other, decides: rounding the runner timer
  up to a tick changes when timers fire, not what they decide."""
  params = PARAMS._replace(event_time=event_time, expire_tick_ms=expire_tick)
  steps = _steps(raw)
  coarse, coarse_reps, coarse_state = _run_shard(steps, params)
  fine = []
  for kind, value in steps:
    if kind == "add":
      fine.append((kind, value))
      continue
    # The earliest armed time up to ``value``, as its own fire, until none.
    for _ in range(100):
      sim_state = _run_shard(fine, params)[2]
      armed = np.concatenate([sim_state.settle_timer, sim_state.expire_timer])
      armed = armed[armed <= value]
      if not len(armed):
        break
      fine.append(("fire", int(armed.min())))
    fine.append(("fire", value))
  fine_answers, fine_reps, fine_state = _run_shard(fine, params)
  assert coarse == fine_answers
  assert coarse_reps == fine_reps
  assert coarse_state.clock.tolist() == fine_state.clock.tolist()


def _contents(state, members):
  """A shard's buckets by key, with member ids in place of member rows."""
  out = {}
  for i, key in enumerate(state.keys.tolist()):
    rep = int(state.rep[i])
    out[key] = [members.doc_id(rep) if rep >= 0 else None] + [
        int(c[i]) for c in state[2:6]] + [[]]
  for key, band, row in zip(state.pending_keys.tolist(),
                            state.pending_bands.tolist(),
                            state.pending_rows.tolist()):
    out[key][-1].append((band, members.doc_id(row)))
  return out


# More keys than the merge thresholds, so that layers override each other.
wide_shard_steps = shard_steps_of(12, 8, 14)


@settings(max_examples=300, deadline=None)
@given(wide_shard_steps, st.sampled_from([True, False]), st.integers(0, 12),
       st.integers(0, 12), st.sampled_from([1, 25, 200]))
def test_layered_shard_equals_the_whole_shard(raw, event_time, hot_rows,
                                              hot_members, expire_tick):
  """A shard in cold and hot layers (merged after every step or never, as
  the thresholds say) answers, counts, arms its timer and ends in the
  state of the whole shard's kernel, each step through a coder round
  trip."""
  # pylint: disable=import-outside-toplevel,protected-access
  from transforms.kernels import stream_layers as sl
  params = PARAMS._replace(event_time=event_time, expire_tick_ms=expire_tick)
  saved = sl._HOT_ROWS, sl._HOT_MEMBERS
  sl._HOT_ROWS, sl._HOT_MEMBERS = hot_rows, hot_members
  try:
    state, members = ss.empty_state(), ss.empty_members(K)
    layers = sl.empty_layers(K)
    s_coder, m_coder = ShardStateCoder(), MemberTableCoder()
    for kind, value in _steps(raw):
      whole = ss.Shard(state, members, params)
      layered = sl.LayeredShard(layers, params)
      for shard in (whole, layered):
        if kind == "add" and value:
          shard.add(np.array([r[0] for r in value], np.uint64),
                    np.array([r[0] % 7 for r in value], np.int64),
                    np.arange(len(value)),
                    table(*[member(r[1], r[2], r[3]) for r in value]))
        elif kind == "fire":
          shard.fire(value)
      assert sorted(layered.answers) == sorted(whole.answers)
      for counter in ("live_delta", "pending_delta", "early_settles"):
        assert getattr(layered, counter) == getattr(whole, counter)
      state = s_coder.decode(s_coder.encode(whole.state()))
      members = m_coder.decode(m_coder.encode(whole.table))
      assert layered.next_timer() == ss.Shard(state, members,
                                              params).next_timer()
      # Only the parts said to have changed are written (as _BucketsFn
      # does); the others are read back as they were.
      layers = sl.Layers(*(
          coder.decode(coder.encode(part)) if name in layered.changed
          else old for name, coder, part, old in zip(
              sl.Layers._fields, (s_coder, m_coder, DueIndexCoder(), s_coder,
                                  m_coder, beam.coders.VarIntCoder()),
              layered.layers, layers)))
      merged = sl.compacted(layers)
      assert (np.diff(merged.cold.keys.astype(np.float64)) > 0).all()
      assert _contents(merged.cold, merged.cold_members) == _contents(
          state, members)
  finally:
    sl._HOT_ROWS, sl._HOT_MEMBERS = saved


def test_a_bucket_fired_from_the_hot_layer_does_not_arm_its_old_timer():
  """A cold bucket whose settle timer fired lives on in the hot layer with
  its next timer (its expiry); the cold layer's spent timer must not arm
  the shard's runner timer again (the timer would fire in the past,
  forever)."""
  # pylint: disable=import-outside-toplevel,protected-access
  from transforms.kernels import stream_layers as sl
  sig = np.zeros(K, np.uint32)
  shard = sl.LayeredShard(sl.empty_layers(K), PARAMS)
  shard.add(np.array([1], np.uint64), np.array([1]), np.arange(1),
            table(member("a", 10, sig)))
  shard = sl.LayeredShard(sl.compacted(shard.layers), PARAMS)
  assert shard.next_timer() == 125  # settle at 10 + 100, up to the tick
  shard.fire(125)
  assert shard.answers == [("a", 1, sk.REP, "", 0, 1.0)]
  assert len(shard.layers.cold.keys) == len(shard.layers.hot.keys) == 1
  expiry = 10 + PARAMS.retention_ms
  assert shard.next_timer() == -(-expiry // 25) * 25


def test_a_shard_of_the_one_layer_graph_reads_as_its_cold_layer():
  """State written by the graph before the layers (a whole shard in the
  ``buckets`` and ``members`` cells, format 1, no other cell) is read as
  a cold layer with its timers indexed: the next step answers as the
  whole shard's kernel does."""
  # pylint: disable=import-outside-toplevel
  from transforms.kernels import stream_layers as sl
  sig = np.zeros(K, np.uint32)
  whole = ss.Shard(ss.empty_state(), ss.empty_members(K), PARAMS)
  whole.add(np.array([1, 2], np.uint64), np.array([1, 2]), np.arange(2),
            table(member("a", 10, sig), member("b", 40, sig)))
  old_state, old_table = whole.state(), whole.table
  # (Format 1's arrays are read as well: see the coder test.)
  parts = [ShardStateCoder().decode(ShardStateCoder().encode(old_state)),
           MemberTableCoder().decode(MemberTableCoder().encode(old_table)),
           None, None, None, None]
  layered = sl.LayeredShard(sl.from_cells(parts, K), PARAMS)
  again = ss.Shard(old_state, old_table, PARAMS)
  assert layered.next_timer() == again.next_timer() == 125
  layered.fire(150)
  again.fire(150)
  assert sorted(layered.answers) == sorted(again.answers) and again.answers


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(
    st.lists(st.sampled_from(["a", "b", "é", "dd", "e", "ff", ""]),
             max_size=4, unique=True),
    st.binary(max_size=5)), max_size=8), st.booleans())
def test_blob_table_behaves_as_a_dict(steps, weak_hash):
  """Each step replaces the records of some ids (or removes them, for an
  empty record) through a coder round trip; the table then holds exactly
  the dict's rows, also when ids share a hash (a weak hash stands in for
  the 64-bit one)."""
  # pylint: disable=import-outside-toplevel
  from unittest import mock

  from transforms.kernels import stream_table as tk
  from transforms.stream.elements import BlobTableCoder
  coder = BlobTableCoder()
  model, table = {}, tk.empty_table()
  weak = len if weak_hash else tk.id_hash
  # The table sorts by the hash and looks rows up through stream_shard's.
  with mock.patch.object(tk, "id_hash", weak), mock.patch.object(
      ss, "id_hash", weak):
    for ids, record in steps:
      rows = tk.find(table, ids)
      for doc_id, row in zip(ids, rows.tolist()):
        assert (row >= 0) == (doc_id in model)
        if row >= 0:
          assert table.blob(row) == model[doc_id]
        if record:
          model[doc_id] = record
        else:
          model.pop(doc_id, None)
      kept = [i for i in ids if record]
      table = coder.decode(coder.encode(tk.updated(
          table, rows[rows >= 0], kept, [record] * len(kept))))
      assert len(table) == len(model)
      found = tk.find(table, list(model))
      assert (found >= 0).all()
      assert {i: table.blob(r) for i, r in zip(model, found.tolist())} == (
          model)
