"""pipeline.introspection: Beam's DoFn introspection answered once, with
Beam's own answers."""

import gc

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import core, userstate
from apache_beam.transforms.timeutil import TimeDomain

from pipeline import introspection

introspection.memoize_introspection()
BEAMS_SPECS = introspection._BEAMS_OWN["get_dofn_specs"]  # pylint: disable=protected-access
BEAMS_ARGS = introspection._BEAMS_OWN["get_function_args_defaults"]  # pylint: disable=protected-access


class _Counting(beam.DoFn):
  COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())
  FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)

  def process(self, element, count=beam.DoFn.StateParam(COUNT),
              flush=beam.DoFn.TimerParam(FLUSH)):
    seen = (count.read() or 0) + 1
    count.write(seen)
    flush.set(0)
    yield element[0], seen

  @userstate.on_timer(FLUSH)
  def on_flush(self, count=beam.DoFn.StateParam(COUNT)):
    count.clear()


class _Plain(beam.DoFn):

  def process(self, element, timestamp=beam.DoFn.TimestampParam):
    yield element


def _dofns():
  return [_Counting(), _Plain(), core.CallableWrapperDoFn(lambda x: [x]),
          core.CallableWrapperDoFn(lambda x, y=3: [x + y])]


def test_installed_once():
  assert userstate.get_dofn_specs is introspection._dofn_specs  # pylint: disable=protected-access
  introspection.memoize_introspection()
  assert introspection._BEAMS_OWN["get_dofn_specs"] is BEAMS_SPECS  # pylint: disable=protected-access


def test_specs_are_beams_own_and_each_caller_gets_its_own_sets():
  for dofn in _dofns():
    expected = BEAMS_SPECS(dofn)
    first = userstate.get_dofn_specs(dofn)
    assert first == expected
    first[0].add("mutated")
    assert userstate.get_dofn_specs(dofn) == expected
  states, timers = userstate.get_dofn_specs(_Counting())
  assert {s.name for s in states} == {"count"}
  assert [t.name.endswith("flush") for t in timers] == [True]
  assert userstate.is_stateful_dofn(_Counting())
  assert not userstate.is_stateful_dofn(_Plain())


def test_arguments_are_beams_own_for_methods_functions_and_wrappers():
  def free(a, b=2, *rest, key=None):
    return a, b, rest, key

  for dofn in _dofns():
    for name in ("process", "setup", "start_bundle", "finish_bundle"):
      expected = BEAMS_ARGS(getattr(dofn, name))
      got = core.get_function_args_defaults(getattr(dofn, name))
      assert got == expected
      got[0].append("mutated")
      assert core.get_function_args_defaults(getattr(dofn, name)) == expected
  for f in (free, len, print, lambda: None):
    assert core.get_function_args_defaults(f) == BEAMS_ARGS(f)


def test_a_dead_dofn_is_forgotten():
  dofn = core.CallableWrapperDoFn(lambda x: [x])
  userstate.get_dofn_specs(dofn)
  key = id(dofn)
  assert key in introspection._SPECS  # pylint: disable=protected-access
  del dofn
  gc.collect()
  assert key not in introspection._SPECS  # pylint: disable=protected-access


def test_specs_of_a_dofn_whose_class_decides_them_are_kept_per_class():
  """The BundleBasedDirectRunner unpickles a new DoFn for every bundle:
  the answer is the class's, not asked again per instance; an instance
  with a method of its own is still asked about itself."""
  userstate.get_dofn_specs(_Counting())
  assert _Counting in introspection._SPECS_OF_CLASS  # pylint: disable=protected-access
  other = _Counting()
  other.process = lambda element: [element]
  assert userstate.get_dofn_specs(other) == BEAMS_SPECS(other)
  assert id(other) in introspection._SPECS  # pylint: disable=protected-access


def test_a_stateful_dofn_still_runs_with_its_state_and_timers():
  with TestPipeline(runner="FnApiRunner") as p:
    out = (p | beam.Create([("a", 1), ("a", 2), ("b", 3)])
           | beam.ParDo(_Counting()))
    assert_that(out, equal_to([("a", 1), ("a", 2), ("b", 1)]))


def test_yield_and_return_check_is_beams_own():
  beams = introspection._BEAMS_OWN["_check_fn_use_yield_and_return"]  # pylint: disable=protected-access

  class Both(beam.DoFn):
    def process(self, element):
      if element:
        return [element]
      yield element

  for dofn in _dofns() + [Both()]:
    expected = beams(dofn.process)
    assert core._check_fn_use_yield_and_return(dofn.process) == expected  # pylint: disable=protected-access
    assert core._check_fn_use_yield_and_return(dofn.process) == expected  # pylint: disable=protected-access
  assert core._check_fn_use_yield_and_return(Both().process)  # pylint: disable=protected-access
