"""One Beam SDK worker (the SDK harness) as :mod:`pipeline.worker_pool`
starts it: Beam's ``SdkHarness`` with a state cache, whose entries are
sized without rescanning every loaded module.

Beam 2.77's state cache weighs each value it stores with
``objsize.get_deep_size``, which first collects the globals of every module
in ``sys.modules`` (about 1,800 in a worker running this project) to
exclude them: 0.85 ms per call, measured, whatever the value's size. A
state write stores twice (clear, then append), so a stateful DoFn paid
~1.7 ms per state cell written; in the streaming graph on Flink that was a
quarter of the SDK workers' time (py-spy). :func:`install_fast_sizing`
gives the cache the same weights (the same traversal, size, referent and
filter functions, the same excluded module globals) from a set of module
globals computed once per change of ``sys.modules``.

  python -m pipeline.sdk_worker --control_endpoint HOST:PORT --worker_id ID
      [--state_cache_bytes N]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, FrozenSet, List, Optional, Tuple


def module_globals_ids() -> FrozenSet[int]:
  """``id()`` of ``None`` and of every loaded module's globals: what objsize
  excludes from every deep size by default."""
  ids = {id(None)}
  for module in list(sys.modules.values()):
    try:
      ids.add(id(vars(module)))
    except TypeError:
      pass
  return frozenset(ids)


def fast_deep_size(settings) -> Callable[..., int]:
  """``objsize``'s deep size under ``settings`` (an ``ObjSizeSettings``
  with ``exclude_modules_globals`` on), the module globals' ids computed
  again only when the number of loaded modules changes."""
  # pylint: disable=import-outside-toplevel
  from objsize.traverse import TraversalContext
  own = settings.replace(exclude_modules_globals=False)
  known: List[Tuple[int, FrozenSet[int]]] = [(-1, frozenset())]

  def get_deep_size(*objs: Any) -> int:
    count, ids = known[0]
    if count != len(sys.modules):
      count = len(sys.modules)
      ids = module_globals_ids()
      known[0] = (count, ids)
    context = TraversalContext(own)
    context.exclude_set.update(ids)
    return context.get_deep_size(*objs)

  return get_deep_size


def beam_sizing_settings():
  """The ``ObjSizeSettings`` Beam's state cache sizes with (its own size,
  referent and filter functions)."""
  # pylint: disable=import-outside-toplevel,protected-access
  from apache_beam.runners.worker import statecache
  from objsize.traverse import ObjSizeSettings
  return ObjSizeSettings(get_size_func=statecache._size_func,
                         get_referents_func=statecache._get_referents_func,
                         filter_func=statecache._filter_func)


def install_fast_sizing() -> None:
  """Makes Beam's state cache (this process) size its entries with
  :func:`fast_deep_size`."""
  # pylint: disable=import-outside-toplevel
  from apache_beam.runners.worker import statecache
  statecache.get_deep_size = fast_deep_size(beam_sizing_settings())


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m pipeline.sdk_worker",
      description=__doc__.split("\n\n", maxsplit=1)[0])
  parser.add_argument("--control_endpoint", required=True,
                      help="the runner's control service, HOST:PORT")
  parser.add_argument("--worker_id", required=True)
  parser.add_argument("--state_cache_bytes", type=int, default=0,
                      help="state cache size in bytes (0: off)")
  args = parser.parse_args(argv)
  if args.state_cache_bytes < 0:
    parser.error("--state_cache_bytes must be >= 0 (0 turns the cache off),"
                 f" got {args.state_cache_bytes}")
  return args


def main(argv: Optional[List[str]] = None) -> int:
  """Runs the SDK harness until the runner closes its control channel."""
  args = parse_args(argv)
  # pylint: disable=import-outside-toplevel
  from apache_beam.runners.worker.sdk_worker import SdkHarness
  install_fast_sizing()
  SdkHarness(args.control_endpoint, worker_id=args.worker_id,
             state_cache_size=args.state_cache_bytes,
             data_buffer_time_limit_ms=-1).run()
  return 0


if __name__ == "__main__":
  sys.exit(main())
