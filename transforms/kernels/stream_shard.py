"""Many streaming LSH buckets in one shard of the band-key space.

:func:`transforms.kernels.stream.decide` says what one bucket answers; this
module holds every bucket of a shard in a few numpy arrays (one row per band
key, sorted) and a table of the members they reference, so that a runner
pays its per-element, per-state-cell and per-timer costs once per shard and
bundle instead of once per band entry.

Each bucket behaves exactly as a bucket keyed by its own band key with its
own two event-time timers: ``settle`` (decide the waiting entries whose
event time + settle the watermark passed, in (event time, id) order) and
``expire`` (drop the representative once the watermark passes its event
time + retention; the clock alone is kept as long again, then everything).
Its clock is the latest of its own timers fired. The shard's one runner
timer is set to the earliest armed bucket timer rounded up to ``tick_ms``;
when it fires at ``T`` every bucket timer due by ``T`` fires, in time order,
with its own time. Rounding only delays when a timer fires (by less than a
tick), as a runner may: what each fired timer decides is the same.
"""

from __future__ import annotations

import hashlib
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from transforms.kernels import stream as sk

# An unarmed timer or unset settle time (sorts after every time).
UNSET = np.iinfo(np.int64).max
# A bucket without a clock (no timer fired yet): never makes an entry late.
NO_CLOCK = np.iinfo(np.int64).min
_NO_SHINGLES = np.zeros(0, dtype=np.uint64)


class MemberTable(NamedTuple):
  """Members (documents) by row: ids (UTF-8, row i is
  ``id_bytes[id_offsets[i]:id_offsets[i + 1]]``), event times, signatures
  (``uint32[m, K]``) and shingle sets (flat, ``offsets[m + 1]``; empty
  unless verification is exact)."""
  id_bytes: bytes  # or a memoryview of them (a decoded cell's)
  id_offsets: np.ndarray
  event_ms: np.ndarray
  signatures: np.ndarray
  shingles: np.ndarray
  offsets: np.ndarray

  def __len__(self):
    return len(self.event_ms)

  def doc_id(self, row: int) -> str:
    return str(self.id_bytes[self.id_offsets[row]:self.id_offsets[row + 1]],
               "utf-8")

  @property
  def nbytes(self) -> int:
    return len(self.id_bytes) + sum(
        a.nbytes for a in (self.id_offsets, self.event_ms, self.signatures,
                           self.shingles, self.offsets))


def member_table(ids, event_ms, signatures, shingles) -> MemberTable:
  """A table of members from their ids, event times, signatures and shingle
  sets (lists, one per member)."""
  encoded = [i.encode("utf-8") for i in ids]
  return MemberTable(b"".join(encoded), _offsets(map(len, encoded), len(ids)),
                     np.asarray(event_ms, np.int64),
                     np.asarray(signatures, np.uint32),
                     np.concatenate(shingles) if any(len(x) for x in shingles)
                     else _NO_SHINGLES,
                     _offsets(map(len, shingles), len(ids)))


def _offsets(lengths, n: int) -> np.ndarray:
  offsets = np.zeros(n + 1, np.int64)
  np.cumsum(np.fromiter(lengths, np.int64, n), out=offsets[1:])
  return offsets


def empty_members(num_perm: int) -> MemberTable:
  return MemberTable(b"", np.zeros(1, np.int64), np.zeros(0, np.int64),
                     np.zeros((0, num_perm), np.uint32), _NO_SHINGLES,
                     np.zeros(1, np.int64))


def concat_members(a: MemberTable, b: MemberTable) -> MemberTable:
  if not len(a):
    return b
  if not len(b):
    return a
  return MemberTable(
      b"".join((a.id_bytes, b.id_bytes)),
      np.concatenate([a.id_offsets, b.id_offsets[1:] + a.id_offsets[-1]]),
      np.concatenate([a.event_ms, b.event_ms]),
      np.concatenate([a.signatures, b.signatures]),
      np.concatenate([a.shingles, b.shingles]),
      np.concatenate([a.offsets, b.offsets[1:] + a.offsets[-1]]))


def ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
  """The indices ``starts[i]`` to ``ends[i]`` (exclusive) of every i, in
  order, as one array."""
  lengths = ends - starts
  before = np.cumsum(lengths) - lengths
  return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(
      starts - before, lengths)


def take_ragged(flat: np.ndarray, offsets: np.ndarray, rows: np.ndarray):
  """Rows ``rows`` of a ragged array (row i is ``flat[offsets[i]:offsets[i +
  1]]``): ``(their values, flat, and their offsets)``, in one gather."""
  rows = np.asarray(rows, dtype=np.int64)
  starts, ends = offsets[rows], offsets[rows + 1]
  new = np.zeros(len(rows) + 1, np.int64)
  np.cumsum(ends - starts, out=new[1:])
  return flat[ranges(starts, ends)], new


def _take_bytes(data: bytes, offsets: np.ndarray, rows: np.ndarray):
  values, new = take_ragged(np.frombuffer(data, np.uint8), offsets, rows)
  return values.tobytes(), new


def take_members(table: MemberTable, rows: np.ndarray) -> MemberTable:
  """The members at ``rows`` (in that order)."""
  rows = np.asarray(rows, dtype=np.int64)
  ids, id_offsets = _take_bytes(table.id_bytes, table.id_offsets, rows)
  shingles, offsets = take_ragged(table.shingles, table.offsets, rows)
  return MemberTable(ids, id_offsets, table.event_ms[rows],
                     table.signatures[rows],
                     shingles if offsets[-1] else _NO_SHINGLES, offsets)


class ShardState(NamedTuple):
  """Every bucket of a shard, one row per band key (``keys`` sorted):
  its representative (a member row, -1 for none), its clock, the earliest
  settle time of its waiting entries, its two armed timers; and the waiting
  entries (key, band, member row)."""
  keys: np.ndarray
  rep: np.ndarray
  clock: np.ndarray
  settle_at: np.ndarray
  settle_timer: np.ndarray
  expire_timer: np.ndarray
  pending_keys: np.ndarray
  pending_bands: np.ndarray
  pending_rows: np.ndarray

  @property
  def nbytes(self) -> int:
    return sum(a.nbytes for a in self)


def empty_state() -> ShardState:
  u, i = np.zeros(0, np.uint64), np.zeros(0, np.int64)
  return ShardState(u, i, i, i, i, i, u, i, i)


class Params(NamedTuple):
  """The bucket parameters (see :class:`transforms.config.StreamConfig`)."""
  event_time: bool
  settle_ms: int
  window_ms: int
  lateness_ms: int
  retention_ms: int
  max_pending: int
  verify: str
  threshold: float
  tick_ms: int
  # A bucket's clock, kept for a retention after its representative
  # expired, is dropped at the end of that rounded up to this grid (1:
  # exactly), so that the clocks of a stream's buckets go in few runner
  # firings. Keeping a clock longer only recognises late entries longer;
  # representatives expire exactly (their expiry moves the clock).
  expire_tick_ms: int = 1

  def clock_expiry(self, ends):
    """The expire timer of a clock kept until ``ends`` (int or array)."""
    return -(-ends // self.expire_tick_ms) * self.expire_tick_ms


class _Row(NamedTuple):
  """A member as :func:`transforms.kernels.stream.decide` reads it."""
  doc_id: str
  event_ms: int
  signature: np.ndarray
  shingles: np.ndarray
  row: int


# One answer: (doc id, band, kind, judge's id, judge's event time,
# similarity); a late answer's judge time is the bucket's clock.
Answer = Tuple[str, int, int, str, int, float]


class Shard:
  """A working copy of one shard for one runner invocation: apply entries
  (:meth:`add`) or fire the bucket timers due by a time (:meth:`fire`),
  then read the new state back (:meth:`state`, :meth:`members`) with the
  answers and counters (``answers``, ``live_delta``, ``pending_delta``,
  ``early_settles``)."""

  def __init__(self, state: ShardState, members: MemberTable,
               params: Params):
    self.p = params
    self.keys = state.keys
    self.rep = state.rep.copy()
    self.clock = state.clock.copy()
    self.settle_at = state.settle_at.copy()
    self.settle_timer = state.settle_timer.copy()
    self.expire_timer = state.expire_timer.copy()
    self.table = members
    self.members_changed = False
    self._rows: Dict[int, _Row] = {}
    # Waiting entries: those of the buckets this invocation touched as
    # lists (``pending``), the others as they were read (``_held_*``, the
    # bucket of each, ascending).
    self.pending: Dict[int, List[Tuple[int, _Row]]] = {}
    self._held_at = np.searchsorted(self.keys, state.pending_keys)
    self._held_bands = state.pending_bands
    self._held_rows = state.pending_rows
    # False for held entries decided in bulk (see _fire_simple).
    self._held_live = np.ones(len(self._held_at), bool)
    self._runs: Optional[Dict[int, Tuple[int, int]]] = None
    self.answers: List[Answer] = []
    self.live_delta = 0
    # Whether a member may no longer be referenced (see state()).
    self._dropped = False
    # Buckets this invocation changed besides those in ``pending``.
    self._changed: List[np.ndarray] = []
    self.pending_delta = 0
    self.early_settles = 0

  def _member(self, row: int) -> _Row:
    m = self._rows.get(row)
    if m is None:
      t = self.table
      m = _Row(t.doc_id(row), int(t.event_ms[row]), t.signatures[row],
               t.shingles[t.offsets[row]:t.offsets[row + 1]], row)
      self._rows[row] = m
    return m

  def _waiting(self, b: int) -> List[Tuple[int, _Row]]:
    """Bucket ``b``'s waiting entries (band, member), in arrival order."""
    waiting = self.pending.get(b)
    if waiting is None:
      lo, hi = self._held_runs().get(b, (0, 0))
      waiting = [(band, self._member(row)) for band, row, live in zip(
          self._held_bands[lo:hi].tolist(), self._held_rows[lo:hi].tolist(),
          self._held_live[lo:hi].tolist()) if live]
      self.pending[b] = waiting
    return waiting

  def _held_runs(self) -> Dict[int, Tuple[int, int]]:
    """Bucket → the range of its held entries (built once: a lookup per
    entry costs less than a search)."""
    if self._runs is None:
      buckets, starts, counts = np.unique(self._held_at, return_index=True,
                                          return_counts=True)
      self._runs = dict(zip(buckets.tolist(), zip(
          starts.tolist(), (starts + counts).tolist())))
    return self._runs

  def _rep(self, b: int) -> Optional[_Row]:
    row = int(self.rep[b])
    return None if row < 0 else self._member(row)

  def next_timer(self) -> Optional[int]:
    """When the shard's runner timer is due: the earliest armed bucket
    timer rounded up to the tick, or None when none is armed."""
    if not len(self.keys):
      return None
    t = min(int(self.settle_timer.min()), int(self.expire_timer.min()))
    if t == UNSET:
      return None
    tick = self.p.tick_ms
    return -(-t // tick) * tick

  # Entries.

  def add(self, keys: np.ndarray, bands: np.ndarray, rows: np.ndarray,
          members: MemberTable) -> None:
    """Applies band entries in order: entry i is band ``bands[i]`` of
    member ``rows[i]`` of ``members``, for the bucket of ``keys[i]``."""
    base = len(self.table)
    self.table = concat_members(self.table, members)
    self.members_changed = True
    new = np.setdiff1d(keys, self.keys)
    if len(new):
      self._grow(new)
    at = np.searchsorted(self.keys, keys)
    self._changed.append(at)
    for b, band, row in zip(at.tolist(), bands.tolist(),
                            (rows + base).tolist()):
      self._entry(b, band, self._member(row))

  def _grow(self, new: np.ndarray) -> None:
    n = len(new)
    keys = np.concatenate([self.keys, new])
    order = np.argsort(keys, kind="stable")
    self.keys = keys[order]
    remap = np.empty(len(order), np.int64)
    remap[order] = np.arange(len(order))
    self.pending = {int(remap[b]): v for b, v in self.pending.items()}
    self._held_at = remap[self._held_at]
    self._runs = None
    self._changed = [remap[c] for c in self._changed]
    unset = np.full(n, UNSET, np.int64)
    self.rep = np.concatenate([self.rep, np.full(n, -1, np.int64)])[order]
    self.clock = np.concatenate([self.clock, np.full(n, NO_CLOCK,
                                                     np.int64)])[order]
    self.settle_at = np.concatenate([self.settle_at, unset])[order]
    self.settle_timer = np.concatenate([self.settle_timer, unset])[order]
    self.expire_timer = np.concatenate([self.expire_timer, unset])[order]

  def _entry(self, b: int, band: int, m: _Row) -> None:
    p = self.p
    clock = int(self.clock[b])
    if m.event_ms + p.lateness_ms < clock:
      self.answers.append((m.doc_id, band, sk.LATE, "", clock, 0.0))
      return
    rep = self._rep(b)
    if p.event_time and sk.needs_order(rep, m, p.window_ms):
      waiting = self._waiting(b)
      waiting.append((band, m))
      self.pending_delta += 1
      if len(waiting) >= p.max_pending:
        self.early_settles += 1
        self._settle(b, None)
        return
      due = m.event_ms + p.settle_ms
      if due < self.settle_at[b]:
        self.settle_at[b] = due
        self.settle_timer[b] = due
      return
    new_rep, kind, judged_by, similarity = sk.decide(
        rep, m, p.window_ms, p.verify, p.threshold)
    self._store(b, rep, new_rep)
    self._answer(m, band, kind, judged_by, similarity)

  def _answer(self, m, band, kind, judged_by, similarity):
    self.answers.append((
        m.doc_id, band, kind, judged_by.doc_id if judged_by else "",
        judged_by.event_ms if judged_by else 0, float(similarity)))

  def _store(self, b: int, old, new) -> None:
    """A change of representative; a new one arms the expiry."""
    if new is old:
      return
    if old is not None:
      self.live_delta -= 1
      self._dropped = True
    if new is None:
      self.rep[b] = -1
      return
    self.live_delta += 1
    self.rep[b] = new.row
    self.expire_timer[b] = new.event_ms + self.p.retention_ms

  def _settle(self, b: int, now: Optional[int]) -> None:
    """Decides, in order, the waiting entries due at ``now`` (all of them
    when ``now`` is None) and re-arms ``settle`` for the others."""
    waiting = self._waiting(b)
    if not waiting:
      return
    p = self.p
    due, rest = [], []
    for e in waiting:
      (due if now is None or e[1].event_ms + p.settle_ms <= now
       else rest).append(e)
    if not due:
      return
    self.pending_delta -= len(due)
    self.pending[b] = rest
    if rest:
      self.settle_at[b] = min(m.event_ms for _, m in rest) + p.settle_ms
      self.settle_timer[b] = self.settle_at[b]
    else:
      self.settle_at[b] = UNSET
    bands = {id(m): band for band, m in due}
    old = self._rep(b)
    new_rep, decided = sk.decide_in_order(
        old, [m for _, m in due], p.window_ms, p.verify, p.threshold)
    self._store(b, old, new_rep)
    for m, kind, judged_by, similarity in decided:
      self._answer(m, bands[id(m)], kind, judged_by, similarity)

  # Timers.

  def fire(self, until: int) -> None:
    """Fires every bucket timer due by ``until``, each bucket's in time
    order (settle before expire at the same time)."""
    self._fire_simple(until)
    due = np.flatnonzero((self.settle_timer <= until)
                         | (self.expire_timer <= until))
    self._changed.append(due)
    for b in due.tolist():
      while True:
        settle, expire = int(self.settle_timer[b]), int(self.expire_timer[b])
        if min(settle, expire) > until:
          break
        if settle <= expire:
          self.settle_timer[b] = UNSET
          self._on_settle(b, settle)
        else:
          self.expire_timer[b] = UNSET
          self._on_expire(b, expire)

  def _fire_simple(self, until: int) -> None:
    """Fires, for all buckets at once, the timers whose effect needs no
    comparison (what :meth:`_on_settle` and :meth:`_on_expire` do in
    those cases, applied to arrays of buckets): a settle of a bucket
    without a representative whose one waiting entry is due (it becomes
    the representative), and an expiry of a bucket with nothing waiting.
    The others are left to the per-bucket loop."""
    p = self.p
    due = np.flatnonzero(np.minimum(self.settle_timer, self.expire_timer)
                         <= until)
    if self.pending:
      due = due[~np.isin(due, list(self.pending))]
    self._changed.append(due)
    while len(due):
      live = np.flatnonzero(self._held_live)
      live_at = self._held_at[live]
      lo = np.searchsorted(live_at, due, side="left")
      waiting = np.searchsorted(live_at, due, side="right") - lo
      settle, expire = self.settle_timer[due], self.expire_timer[due]
      settles = (settle <= expire) & (waiting == 1) & (self.rep[due] < 0)
      held = live[np.minimum(lo, max(len(live) - 1, 0))] if len(live) else lo
      rows = np.where(settles, self._held_rows[held] if len(live) else 0, 0)
      ms = self.table.event_ms[rows] if len(self.table) else rows
      # Its one entry due, and not expiring within this firing too.
      settles &= (ms + p.settle_ms <= settle) & (ms + p.retention_ms > until)
      expires = (expire < settle) & (waiting == 0)
      if not settles.any() and not expires.any():
        return
      if settles.any():
        b, held, rows = due[settles], held[settles], rows[settles]
        self.clock[b] = np.maximum(self.clock[b], settle[settles])
        self.settle_timer[b] = UNSET
        self.settle_at[b] = UNSET
        self._held_live[held] = False
        self.rep[b] = rows
        self.expire_timer[b] = ms[settles] + p.retention_ms
        self.live_delta += len(b)
        self.pending_delta -= len(b)
        for row, band in zip(rows.tolist(), self._held_bands[held].tolist()):
          self.answers.append((self.table.doc_id(row), band, sk.REP, "", 0,
                               1.0))
      if expires.any():
        b, now = due[expires], expire[expires]
        self.clock[b] = np.maximum(self.clock[b], now)
        rep = self.rep[b]
        has = rep >= 0
        ends = np.zeros(len(b), np.int64)
        ends[has] = self.table.event_ms[rep[has]] + p.retention_ms
        holds = has & (ends > now)
        self.expire_timer[b[holds]] = ends[holds]
        drops = has & ~holds
        self.rep[b[drops]] = -1
        self.live_delta -= int(drops.sum())
        self._dropped |= bool(drops.any())
        # The clock outlives the representative, to recognise late entries.
        self.expire_timer[b[drops]] = p.clock_expiry(now[drops] +
                                                     p.retention_ms)
        empty = b[~has]
        self.expire_timer[empty] = UNSET
        self.clock[empty] = NO_CLOCK
        self.settle_at[empty] = UNSET
      due = due[settles | expires]
      due = due[np.minimum(self.settle_timer[due], self.expire_timer[due])
                <= until]

  def _advance(self, b: int, now: int) -> None:
    if now > self.clock[b]:
      self.clock[b] = now

  def _on_settle(self, b: int, now: int) -> None:
    self._advance(b, now)
    self._settle(b, now)

  def _on_expire(self, b: int, now: int) -> None:
    p = self.p
    self._advance(b, now)
    # Entries due by now are decided against the representative first.
    self._settle(b, now)
    rep = self._rep(b)
    if rep is not None and rep.event_ms + p.retention_ms > now:
      self.expire_timer[b] = rep.event_ms + p.retention_ms
    elif rep is not None:
      self._store(b, rep, None)
      # The clock outlives the representative, to recognise late entries.
      self.expire_timer[b] = p.clock_expiry(now + p.retention_ms)
    elif not self._waiting(b):
      self.clock[b] = NO_CLOCK
      self.settle_at[b] = UNSET

  # Results.

  def state(self, compact_members: bool = True) -> ShardState:
    """The shard's new state: buckets with nothing left are dropped, and
    so, when members no longer referenced make up a quarter of the table
    (or it changed anyway), are they (``members_changed`` says so) unless
    ``compact_members`` is False (then ``table``'s rows keep their
    numbers)."""
    touched = np.array(sorted(self.pending), dtype=np.int64)
    held = ~np.isin(self._held_at, touched) & self._held_live
    # Only a bucket changed here can have become empty.
    changed = np.concatenate(self._changed + [touched])
    empty = changed[(self.rep[changed] < 0) & (self.clock[changed] == NO_CLOCK)
                    & (self.settle_at[changed] == UNSET)
                    & (self.settle_timer[changed] == UNSET)
                    & (self.expire_timer[changed] == UNSET)]
    empty = empty[~np.isin(empty, self._held_at[held])]
    empty = empty[[not self.pending.get(b) for b in empty.tolist()]]
    keep = np.ones(len(self.keys), bool)
    keep[empty] = False
    index = np.flatnonzero(keep) if len(empty) else None
    # Waiting entries by bucket, each bucket's in arrival order.
    fresh = [(b, band, m.row) for b in touched.tolist()
             for band, m in self.pending[b]]
    at = np.concatenate([self._held_at[held],
                         np.array([f[0] for f in fresh], np.int64)])
    order = np.argsort(at, kind="stable")
    p_keys = self.keys[at[order]] if len(at) else np.zeros(0, np.uint64)
    p_bands = np.concatenate([self._held_bands[held], np.array(
        [f[1] for f in fresh], np.int64)])[order]
    p_rows = np.concatenate([self._held_rows[held], np.array(
        [f[2] for f in fresh], np.int64)])[order]
    columns = (self.keys, self.rep, self.clock, self.settle_at,
               self.settle_timer, self.expire_timer)
    if index is not None:
      columns = tuple(c[index] for c in columns)
    rep = columns[1]
    if compact_members and (self.members_changed or self._dropped):
      used = np.zeros(len(self.table), bool)
      used[rep[rep >= 0]] = True
      used[p_rows] = True
      dead = len(self.table) - int(np.count_nonzero(used))
      if dead and (self.members_changed or 4 * dead >= len(self.table)):
        used = np.flatnonzero(used)
        self.table = take_members(self.table, used)
        self.members_changed = True
        rep = np.where(rep >= 0, np.searchsorted(used, rep), -1)
        p_rows = np.searchsorted(used, p_rows).astype(np.int64)
    return ShardState(columns[0], rep, *columns[2:], p_keys, p_bands, p_rows)


# ------------------------------------------------------------ ids seen


class SeenState(NamedTuple):
  """The ids one shard of document ids remembers, sorted by a 64-bit hash
  of the id (``hashes``; the ids themselves tell collisions apart): each
  first document's event time, digests of its record and of its text
  (16 bytes each), and when it is forgotten."""
  hashes: np.ndarray
  id_bytes: bytes
  id_offsets: np.ndarray
  event_ms: np.ndarray
  record_digests: np.ndarray
  text_digests: np.ndarray
  forget_at: np.ndarray

  @property
  def nbytes(self) -> int:
    return len(self.id_bytes) + sum(a.nbytes for a in self[:1] + self[2:])


def empty_seen() -> SeenState:
  i = np.zeros(0, np.int64)
  d = np.zeros((0, 16), np.uint8)
  return SeenState(np.zeros(0, np.uint64), b"", np.zeros(1, np.int64), i, d,
                   d, i)


def id_hash(doc_id: str) -> int:
  return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"),
                                        digest_size=8).digest(), "little")


def find_id(hashes: np.ndarray, id_bytes, id_offsets: np.ndarray,
            doc_id: str) -> Optional[int]:
  """The row of ``doc_id`` in rows sorted by :func:`id_hash` (row i's id is
  ``id_bytes[id_offsets[i]:id_offsets[i + 1]]``; equal hashes are told
  apart by the ids), or None."""
  h = np.uint64(id_hash(doc_id))
  lo = int(np.searchsorted(hashes, h, side="left"))
  hi = int(np.searchsorted(hashes, h, side="right"))
  encoded = doc_id.encode("utf-8")
  for row in range(lo, hi):
    if bytes(id_bytes[id_offsets[row]:id_offsets[row + 1]]) == encoded:
      return row
  return None


# What SeenIds.admit says of a document.
FIRST, REDELIVERY, OTHER_RECORD = 0, 1, 2


class SeenIds:
  """A working copy of one shard of ids seen: :meth:`admit` documents, or
  :meth:`forget` those whose time passed, then read :meth:`state`."""

  def __init__(self, state: SeenState, retention_ms: int, tick_ms: int):
    self._state = state
    self._retention_ms = retention_ms
    self._tick_ms = tick_ms
    self._keep = np.ones(len(state.hashes), bool)
    self._new: Dict[str, Tuple[int, bytes, bytes]] = {}

  def admit(self, doc_id: str, event_ms: int, record_digest: bytes,
            text_digest: bytes) -> Tuple[int, int, bool]:
    """``(what, first event ms, same text)`` for a document: ``FIRST``
    (remembered from now on), ``REDELIVERY`` (the same record again) or
    ``OTHER_RECORD`` (another record under an id already seen)."""
    first = self._new.get(doc_id)
    if first is None:
      s = self._state
      row = find_id(s.hashes, s.id_bytes, s.id_offsets, doc_id)
      if row is not None:
        s = self._state
        first = (int(s.event_ms[row]), s.record_digests[row].tobytes(),
                 s.text_digests[row].tobytes())
    if first is None:
      self._new[doc_id] = (event_ms, record_digest, text_digest)
      return FIRST, event_ms, True
    if first[1] == record_digest:
      return REDELIVERY, first[0], True
    return OTHER_RECORD, first[0], first[2] == text_digest

  def forget(self, until: int) -> None:
    """Forgets the ids whose time (event time + retention) is by
    ``until``."""
    self._keep &= self._state.forget_at > until

  def state(self) -> SeenState:
    s = self._state
    rows = np.flatnonzero(self._keep)
    ids, id_offsets = _take_bytes(s.id_bytes, s.id_offsets, rows)
    new = list(self._new.items())
    encoded = [doc_id.encode("utf-8") for doc_id, _ in new]
    hashes = np.concatenate([s.hashes[rows], np.array(
        [id_hash(doc_id) for doc_id, _ in new], np.uint64)])
    ms = np.array([v[0] for _, v in new], np.int64)
    digests = [np.frombuffer(b"".join(v[i] for _, v in new),
                             np.uint8).reshape(len(new), 16)
               for i in (1, 2)]
    id_bytes = ids + b"".join(encoded)
    all_offsets = np.concatenate([id_offsets, id_offsets[-1] + np.cumsum(
        np.fromiter(map(len, encoded), np.int64, len(encoded)))])
    order = np.argsort(hashes, kind="stable")
    ids_sorted, offsets = _take_bytes(id_bytes, all_offsets, order)
    return SeenState(
        hashes[order], ids_sorted, offsets,
        np.concatenate([s.event_ms[rows], ms])[order],
        np.concatenate([s.record_digests[rows], digests[0]])[order],
        np.concatenate([s.text_digests[rows], digests[1]])[order],
        np.concatenate([s.forget_at[rows], ms + self._retention_ms])[order])

  def next_timer(self, state: SeenState) -> Optional[int]:
    if not len(state.forget_at):
      return None
    t = int(state.forget_at.min())
    return -(-t // self._tick_ms) * self._tick_ms
