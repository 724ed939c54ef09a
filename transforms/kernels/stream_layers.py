"""A shard of streaming buckets kept in two layers, so that an invocation
costs what it touches, not what the shard holds.

A shard (:mod:`transforms.kernels.stream_shard`) read, changed and written
whole on every element and timer tick costs O(state) per invocation: a
stream's cost grew with the square of its length (a 20k-document run spent
most of its time copying and encoding whole shards). Here a shard is

* a **cold** layer: a :class:`ShardState`, its :class:`MemberTable` and a
  :class:`DueIndex` of its timers, rewritten only when the hot layer is
  merged into it (:func:`compacted`), and
* a **hot** layer: the buckets changed since (each row overrides the cold
  row of its key; an empty row deletes it) with their waiting entries, and
  the members added since (member rows number on from the cold table's).

Each invocation takes the buckets it needs (those of its entries, or those
whose timers are due) from the two layers into a small :class:`Shard`, runs
the same kernel on them and writes them back into the hot layer. Buckets
never see each other (a shard answers as its buckets alone would), so the
answers and the buckets' state are those of the whole shard's kernel.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from transforms.kernels import stream_shard as ss

# The hot layer is merged into the cold one once it holds more than this
# many buckets (or members), or more than 1/_HOT_FRACTION of the cold
# layer's: each invocation rewrites the hot layer, each merge the cold one.
_HOT_ROWS = 8192
_HOT_MEMBERS = 2048
_HOT_FRACTION = 8


class DueIndex(NamedTuple):
  """The cold layer's armed buckets by their earliest timer: ``times``
  ascending, ``keys`` their band keys (a bucket the hot layer overrides
  may still be listed: its row here is stale)."""
  times: np.ndarray
  keys: np.ndarray

  @property
  def nbytes(self) -> int:
    return self.times.nbytes + self.keys.nbytes


def due_index(state: ss.ShardState) -> DueIndex:
  """The :class:`DueIndex` of a shard's armed buckets."""
  times = np.minimum(state.settle_timer, state.expire_timer)
  armed = np.flatnonzero(times != ss.UNSET)
  order = armed[np.argsort(times[armed], kind="stable")]
  return DueIndex(times[order], state.keys[order])


class Layers(NamedTuple):
  """One shard's state: the cold and hot layers (see the module).
  ``fired`` counts the leading entries of ``cold_due`` whose timers fired
  since the layers were merged (their buckets are in the hot layer)."""
  cold: ss.ShardState
  cold_members: ss.MemberTable
  cold_due: DueIndex
  hot: ss.ShardState
  hot_members: ss.MemberTable
  fired: int

  @property
  def nbytes(self) -> int:
    return sum(part.nbytes for part in self[:5]) + 8


def empty_due() -> DueIndex:
  return DueIndex(np.zeros(0, np.int64), np.zeros(0, np.uint64))


def empty_layers(num_perm: int) -> Layers:
  return Layers(ss.empty_state(), ss.empty_members(num_perm), empty_due(),
                ss.empty_state(), ss.empty_members(num_perm), 0)


def from_cells(parts, num_perm: int) -> Layers:
  """:class:`Layers` from the parts a runner read (None for an empty
  cell). A shard written by the one-layer graph before (its ``buckets`` and
  ``members`` cells alone) reads as a cold layer, its due index rebuilt."""
  layers = Layers(*(part if part is not None else empty
                    for part, empty in zip(parts, empty_layers(num_perm))))
  if parts[2] is None and len(layers.cold.keys):
    layers = layers._replace(cold_due=due_index(layers.cold))
  return layers


def _in_sorted(values: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
  """Whether each of ``values`` is in ``sorted_keys`` (ascending)."""
  if not len(sorted_keys):
    return np.zeros(len(values), bool)
  at = np.searchsorted(sorted_keys, values)
  return sorted_keys[np.minimum(at, len(sorted_keys) - 1)] == values


def _rows(state: ss.ShardState, index) -> tuple:
  return tuple(column[index] for column in state[:6])


def _pending_runs(state: ss.ShardState, keys: np.ndarray) -> np.ndarray:
  """Indices of the waiting entries of ``keys`` (sorted, unique): by key,
  each key's in arrival order."""
  return ss.ranges(np.searchsorted(state.pending_keys, keys, "left"),
                   np.searchsorted(state.pending_keys, keys, "right"))


def _pending(state: ss.ShardState, index) -> tuple:
  return (state.pending_keys[index], state.pending_bands[index],
          state.pending_rows[index])


def _assemble(rows, pending) -> ss.ShardState:
  """A :class:`ShardState` from bucket row parts and waiting entry parts
  (each a tuple of columns) of distinct keys, sorted by key (entries of a
  key keep their order)."""
  columns = [np.concatenate([part[i] for part in rows]) for i in range(6)]
  order = np.argsort(columns[0], kind="stable")
  waiting = [np.concatenate([part[i] for part in pending]) for i in range(3)]
  w_order = np.argsort(waiting[0], kind="stable")
  return ss.ShardState(*(c[order] for c in columns),
                       *(w[w_order] for w in waiting))


def _replace_keys(state: ss.ShardState, keys: np.ndarray,
                  new: ss.ShardState) -> ss.ShardState:
  """``state`` with the buckets and waiting entries of ``keys`` (sorted)
  replaced by ``new``'s (whose keys are among them): costs what ``keys``
  and ``new`` hold, plus one pass over ``state``'s arrays."""
  keep = np.ones(len(state.keys), bool)
  present = keys[_in_sorted(keys, state.keys)]
  keep[np.searchsorted(state.keys, present)] = False
  rows = _rows(state, keep)
  where = np.searchsorted(rows[0], new.keys)
  columns = [np.insert(old, where, values)
             for old, values in zip(rows, new[:6])]
  p_keep = np.ones(len(state.pending_keys), bool)
  p_keep[_pending_runs(state, keys)] = False
  waiting = _pending(state, p_keep)
  p_where = np.searchsorted(waiting[0], new.pending_keys)
  pending = [np.insert(old, p_where, values)
             for old, values in zip(waiting, new[6:])]
  return ss.ShardState(*columns, *pending)


def _tombstones(keys: np.ndarray) -> ss.ShardState:
  n = len(keys)
  unset = np.full(n, ss.UNSET, np.int64)
  none = np.zeros(0, np.int64)
  return ss.ShardState(keys, np.full(n, -1, np.int64),
                       np.full(n, ss.NO_CLOCK, np.int64), unset, unset, unset,
                       np.zeros(0, np.uint64), none, none)


class LayeredShard:
  """A working copy of a :class:`Layers` shard for one invocation: apply
  band entries (:meth:`add`) or fire the bucket timers due by a time
  (:meth:`fire`), as :class:`transforms.kernels.stream_shard.Shard` does,
  then read :attr:`layers` (the new state), :attr:`changed` (the names of
  its parts to write), and the kernel's ``answers`` and counters."""

  def __init__(self, layers: Layers, params: ss.Params):
    self.p = params
    self.layers = layers
    self.answers = []
    self.live_delta = self.pending_delta = self.early_settles = 0
    self.changed = set()

  # Reading buckets out of the layers.

  def _take(self, keys: np.ndarray):
    """The buckets of ``keys`` (sorted, unique) that exist, as a small
    :class:`ShardState` with a :class:`MemberTable` of the members they
    reference (``used``: their global rows, ascending)."""
    cold, hot = self.layers.cold, self.layers.hot
    in_hot = _in_sorted(keys, hot.keys)
    rest = keys[~in_hot]
    in_cold = rest[_in_sorted(rest, cold.keys)]
    state = _assemble(
        [_rows(hot, np.searchsorted(hot.keys, keys[in_hot])),
         _rows(cold, np.searchsorted(cold.keys, in_cold))],
        [_pending(hot, _pending_runs(hot, keys[in_hot])),
         _pending(cold, _pending_runs(cold, in_cold))])
    rep = state.rep
    used = np.unique(np.concatenate([rep[rep >= 0], state.pending_rows]))
    n_cold = len(self.layers.cold_members)
    table = ss.concat_members(
        ss.take_members(self.layers.cold_members, used[used < n_cold]),
        ss.take_members(self.layers.hot_members,
                        used[used >= n_cold] - n_cold))
    local = state._replace(
        rep=np.where(rep >= 0, np.searchsorted(used, rep), -1),
        pending_rows=np.searchsorted(used, state.pending_rows).astype(
            np.int64))
    return local, table, used

  def _run(self, keys: np.ndarray, work) -> None:
    """Runs ``work(shard)`` on the buckets of ``keys`` (sorted, unique) and
    writes them back into the hot layer."""
    local, table, used = self._take(keys)
    shard = ss.Shard(local, table, self.p)
    work(shard)
    out = shard.state(compact_members=False)
    self.answers += shard.answers
    self.live_delta += shard.live_delta
    self.pending_delta += shard.pending_delta
    self.early_settles += shard.early_settles
    self._put(keys, out, shard.table, used)

  def _put(self, keys, out: ss.ShardState, table: ss.MemberTable,
           used: np.ndarray) -> None:
    layers = self.layers
    n_cold, n_hot = len(layers.cold_members), len(layers.hot_members)
    # Local member rows → global: the rows taken, then the new members
    # that a bucket still references, appended to the hot members.
    refs = np.concatenate([out.rep[out.rep >= 0], out.pending_rows])
    fresh = np.unique(refs[refs >= len(used)])
    to_global = np.full(len(table), -1, np.int64)
    to_global[:len(used)] = used
    to_global[fresh] = n_cold + n_hot + np.arange(len(fresh))
    hot_members = layers.hot_members
    if len(fresh):
      hot_members = ss.concat_members(hot_members,
                                      ss.take_members(table, fresh))
    out = out._replace(
        rep=np.where(out.rep >= 0, to_global[np.maximum(out.rep, 0)], -1),
        pending_rows=to_global[out.pending_rows])
    # Buckets that the kernel dropped and the cold layer still holds are
    # deleted by an empty row.
    gone = keys[~_in_sorted(keys, out.keys)]
    gone = gone[_in_sorted(gone, layers.cold.keys)]
    if len(gone):
      out = _assemble([out[:6], _tombstones(gone)[:6]], [out[6:]])
    self.layers = layers._replace(
        hot=_replace_keys(layers.hot, keys, out), hot_members=hot_members)
    self.changed.add("hot")
    if len(fresh):
      self.changed.add("hot_members")

  # The kernel's two operations.

  def add(self, keys: np.ndarray, bands: np.ndarray, rows: np.ndarray,
          members: ss.MemberTable) -> None:
    """Applies band entries, as :meth:`Shard.add`."""
    self._run(np.unique(keys),
              lambda shard: shard.add(keys, bands, rows, members))
    self._maybe_compact()

  def fire(self, until: int) -> None:
    """Fires every bucket timer due by ``until``, as :meth:`Shard.fire`."""
    layers = self.layers
    hot, index = layers.hot, layers.cold_due
    # Cold buckets due and not fired yet; those the hot layer overrides
    # are due, or not, by their hot row.
    end = max(layers.fired, int(np.searchsorted(index.times, until,
                                                "right")))
    cold_due = index.keys[layers.fired:end]
    due = np.union1d(
        hot.keys[(hot.settle_timer <= until) | (hot.expire_timer <= until)],
        cold_due[~_in_sorted(cold_due, hot.keys)])
    if len(due):
      self._run(due.astype(np.uint64), lambda shard: shard.fire(until))
    # Every cold bucket listed before ``end`` is in the hot layer now.
    self.layers = self.layers._replace(fired=end)
    if end != layers.fired:
      self.changed.add("fired")
    self._maybe_compact()

  def next_timer(self) -> Optional[int]:
    """When the shard's runner timer is due: the earliest armed bucket
    timer rounded up to the tick, or None when none is armed."""
    layers = self.layers
    hot, index = layers.hot, layers.cold_due
    t = int(np.minimum(hot.settle_timer, hot.expire_timer).min()) if len(
        hot.keys) else ss.UNSET
    # The earliest cold bucket listed after those fired that the hot layer
    # does not override (its listed time is its own).
    start, step = layers.fired, 16
    while start < len(index.keys):
      live = np.flatnonzero(~_in_sorted(index.keys[start:start + step],
                                        hot.keys))
      if len(live):
        t = min(t, int(index.times[start + live[0]]))
        break
      start, step = start + step, step * 4
    if t == ss.UNSET:
      return None
    tick = self.p.tick_ms
    return -(-t // tick) * tick

  # Merging the layers.

  def _maybe_compact(self) -> None:
    layers = self.layers
    # A bucket with no timer armed holds nothing: with none armed, the
    # merge leaves an empty shard (and its cells are cleared).
    idle = self.next_timer() is None and any(map(len, (
        layers.cold.keys, layers.cold_members, layers.hot.keys,
        layers.hot_members)))
    # The member tables (~K * 4 bytes a row) are merged less often than
    # the buckets (~50 bytes a row): merging buckets alone leaves them, and
    # their row numbers, as they are.
    members = idle or len(layers.hot_members) > max(
        _HOT_MEMBERS, len(layers.cold_members) // _HOT_FRACTION)
    if members or len(layers.hot.keys) > max(
        _HOT_ROWS, len(layers.cold.keys) // _HOT_FRACTION):
      self.layers = compacted(layers, members)
      self.changed |= {"cold", "cold_due", "hot", "fired"}
      if members:
        self.changed |= {"cold_members", "hot_members"}


def compacted(layers: Layers, members: bool = True) -> Layers:
  """``layers`` with the hot layer's buckets merged into the cold one (empty
  rows dropped) and, when ``members`` is True, its members too, keeping
  only those a bucket references: the state that the whole shard's kernel
  would hold, up to the order of member rows."""
  cold, hot, index = layers.cold, layers.hot, layers.cold_due
  empty = ((hot.rep < 0) & (hot.clock == ss.NO_CLOCK)
           & (hot.settle_at == ss.UNSET) & (hot.settle_timer == ss.UNSET)
           & (hot.expire_timer == ss.UNSET)
           & ~_in_sorted(hot.keys, hot.pending_keys))
  kept = hot._replace(**dict(zip(ss.ShardState._fields[:6],
                                  _rows(hot, ~empty))))
  # Merged, not re-sorted: each merge costs a pass over the cold layer.
  merged = _replace_keys(cold, hot.keys, kept)
  stays = ~_in_sorted(index.keys, hot.keys)
  fresh = due_index(kept)
  times = index.times[stays]
  where = np.searchsorted(times, fresh.times, "right")
  due = DueIndex(np.insert(times, where, fresh.times),
                 np.insert(index.keys[stays], where, fresh.keys))
  num_perm = layers.cold_members.signatures.shape[1]
  if not members:
    return Layers(merged, layers.cold_members, due, ss.empty_state(),
                  layers.hot_members, 0)
  table = ss.concat_members(layers.cold_members, layers.hot_members)
  rep = merged.rep
  used = np.unique(np.concatenate([rep[rep >= 0], merged.pending_rows]))
  if len(used) < len(table):
    table = ss.take_members(table, used)
    merged = merged._replace(
        rep=np.where(rep >= 0, np.searchsorted(used, rep), -1),
        pending_rows=np.searchsorted(used, merged.pending_rows).astype(
            np.int64))
  return Layers(merged, table, due, ss.empty_state(),
                ss.empty_members(num_perm), 0)
