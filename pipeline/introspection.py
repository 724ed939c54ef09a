"""Beam's DoFn introspection, answered once.

Beam 2.77 asks "which state and timer specs does this DoFn declare?"
(``userstate.get_dofn_specs``) about eight times for every ParDo while the
graph is built, translated and set up in the worker, and each answer takes
``inspect.signature`` of every bound method of the DoFn (about 32, most of
them the same base-class methods for every DoFn). For this job's 90 ParDos
that was 716 calls and 22,636 signatures: 0.73 s of a 1.5 s 20-document run
under cProfile.

:func:`memoize_introspection` keeps three of Beam's answers:

- a function's ``(argument names, defaults)`` (``core.
  get_function_args_defaults``), per function, for as long as it lives: a
  bound method's signature is its function's without the first parameter,
  so it is the same for every instance;
- whether a ``process`` method both yields and returns a value (``core.
  _check_fn_use_yield_and_return``, which reads and tokenizes the method's
  source for every ParDo: 90 times a job, 38 ms under cProfile), per
  function: it depends on the source alone;
- a DoFn's state and timer specs: per class where they follow from the
  class's methods alone (``process`` read as written and no method
  replaced on the instance: the BundleBasedDirectRunner unpickles a new
  instance for every bundle, so a per-instance answer was asked afresh
  each bundle, 11% of a timer-heavy streaming run), else per instance, for
  as long as it lives (fixed once it is constructed).

The answers are Beam's own; only repeats are saved.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Dict, List, Tuple

from apache_beam.transforms import core, userstate

_LOCK = threading.Lock()
_BEAMS_OWN: Dict[str, Callable] = {}
# function -> (argument names, defaults), for bound methods and the rest.
_ARGS_OF_BOUND: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_ARGS_OF_PLAIN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_YIELDS_AND_RETURNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# id(dofn) -> (weak reference to the dofn, (state specs, timer specs)).
_SPECS: Dict[int, Tuple[weakref.ref, Tuple[frozenset, frozenset]]] = {}
# DoFn class -> (state specs, timer specs), for classes whose methods alone
# decide them.
_SPECS_OF_CLASS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _args_defaults(f) -> Tuple[List[str], List]:
  """``core.get_function_args_defaults(f)``, computed once per function
  (per method, for bound methods); each caller gets lists of its own."""
  function = getattr(f, "__func__", None)
  if function is not None and getattr(f, "__self__", None) is not None:
    table, key = _ARGS_OF_BOUND, function
  else:
    table, key = _ARGS_OF_PLAIN, f
  try:
    with _LOCK:
      known = table.get(key)
  except TypeError:  # not hashable or weakly referenceable
    return _BEAMS_OWN["get_function_args_defaults"](f)
  if known is None:
    known = _BEAMS_OWN["get_function_args_defaults"](f)
    try:
      with _LOCK:
        table[key] = (tuple(known[0]), tuple(known[1]))
    except TypeError:
      return known
  return list(known[0]), list(known[1])


def _yields_and_returns(fn) -> bool:
  """``core._check_fn_use_yield_and_return(fn)``, once per function."""
  key = getattr(fn, "__func__", fn)
  try:
    with _LOCK:
      known = _YIELDS_AND_RETURNS.get(key)
  except TypeError:
    return _BEAMS_OWN["_check_fn_use_yield_and_return"](fn)
  if known is None:
    known = _BEAMS_OWN["_check_fn_use_yield_and_return"](fn)
    try:
      with _LOCK:
        _YIELDS_AND_RETURNS[key] = known
    except TypeError:
      pass
  return known


def _forget_specs(key: int) -> Callable:
  def forget(_ref):
    with _LOCK:
      _SPECS.pop(key, None)
  return forget


def _dofn_specs(dofn) -> Tuple[set, set]:
  """``userstate.get_dofn_specs(dofn)``, computed once per class where
  the class decides them, else once per live instance; each caller gets
  sets of its own."""
  cls = type(dofn)
  by_class = (getattr(cls, "_process_argspec_fn", None)
              is core.DoFn._process_argspec_fn and not any(
                  callable(v) for v in vars(dofn).values()))
  if by_class:
    with _LOCK:
      known = _SPECS_OF_CLASS.get(cls)
    if known is None:
      states, timers = _BEAMS_OWN["get_dofn_specs"](dofn)
      known = (frozenset(states), frozenset(timers))
      with _LOCK:
        _SPECS_OF_CLASS[cls] = known
    return set(known[0]), set(known[1])
  key = id(dofn)
  with _LOCK:
    known = _SPECS.get(key)
  if known is not None and known[0]() is dofn:
    states, timers = known[1]
    return set(states), set(timers)
  states, timers = _BEAMS_OWN["get_dofn_specs"](dofn)
  try:
    ref = weakref.ref(dofn, _forget_specs(key))
  except TypeError:  # not weakly referenceable: answered afresh each time
    return states, timers
  with _LOCK:
    _SPECS[key] = (ref, (frozenset(states), frozenset(timers)))
  return states, timers


def memoize_introspection() -> None:
  """Makes ``core.get_function_args_defaults`` and ``core.
  _check_fn_use_yield_and_return`` answer once per function and
  ``userstate.get_dofn_specs`` once per DoFn instance (every Beam caller
  reaches them through their modules). Idempotent."""
  # pylint: disable=protected-access
  with _LOCK:
    if _BEAMS_OWN:
      return
    _BEAMS_OWN["get_function_args_defaults"] = core.get_function_args_defaults
    _BEAMS_OWN["_check_fn_use_yield_and_return"] = (
        core._check_fn_use_yield_and_return)
    _BEAMS_OWN["get_dofn_specs"] = userstate.get_dofn_specs
    core.get_function_args_defaults = _args_defaults
    core._check_fn_use_yield_and_return = _yields_and_returns
    userstate.get_dofn_specs = _dofn_specs
