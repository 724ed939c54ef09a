"""Which path a kernel call takes: compiled (numba) or pure (numpy, pyarrow,
plain Python).

Every numba kernel lives in :mod:`~transforms.kernels.compiled`, which only
this module imports. Starting numba costs a process about 0.7 s once (its
import, its CPU target's set-up and the cache load: 0.26 s and 0.47 s
measured here), more than a 20-document job spends in all its kernels on the
pure paths. So a process runs the pure paths until its calls need more work
than ``PURE_BUDGET`` in all, or one call needs more than ``SMALL_WORK``; from
then on every call runs compiled. Both paths give bit-identical results
(tests compare them), so which one ran never shows in an output.

Where SciPy is installed (datasketch needs it; most ML environments have
it), numba's CPU target imports ``scipy.linalg`` as it sets up, only to learn
whether ``np.dot`` and the like can be compiled: 0.17-0.25 s of every
process's start measured here, for nothing, as no kernel uses BLAS. Numba
starts with SciPy's BLAS module hidden instead (numba-compiled linear
algebra elsewhere in the same process is then unavailable); set
``NEARDUP_NUMBA_BLAS=1`` to leave it visible.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from types import ModuleType
from typing import Optional

# Work is counted in elements of the arrays a pure path computes (a sketch of
# n shingles with K permutations: n * K); a step of a loop that the
# interpreter runs counts PYTHON_STEP.
PYTHON_STEP = 1024
# A call of at most this much work may run pure: at most about 0.1 s.
SMALL_WORK = 1 << 23
# Pure work a process may spend before it starts numba anyway, so that a job
# of many small batches loses at most about 0.4 s to the pure paths.
PURE_BUDGET = 1 << 25

# What numba imports to check for BLAS (numba/np/linalg.py, ensure_blas).
BLAS_MODULE = "scipy.linalg.cython_blas"

_LOCK = threading.Lock()
_STATE = {"compiled": None, "pure_work": 0}


def compiled_kernels(work: int) -> Optional[ModuleType]:
  """The :mod:`~transforms.kernels.compiled` module for a call of ``work``
  units, or None when the call should take its pure path.

  Args:
    work: the call's size in its own unit (bytes of text, or elements).
  """
  with _LOCK:
    module = _STATE["compiled"]
    if module is None:
      spent = _STATE["pure_work"] + work
      if work <= SMALL_WORK and spent <= PURE_BUDGET:
        _STATE["pure_work"] = spent
        return None
      module = _start_numba()
      _STATE["compiled"] = module
    return module


def _start_numba() -> ModuleType:
  """Imports the compiled kernels and sets up numba's CPU target (what its
  first call would), with SciPy's BLAS hidden unless
  ``NEARDUP_NUMBA_BLAS=1`` or it is already loaded."""
  module = importlib.import_module("transforms.kernels.compiled")
  if (os.environ.get("NEARDUP_NUMBA_BLAS") == "1" or BLAS_MODULE in sys.modules
      or "numba.np.arraymath" in sys.modules):
    return module
  # pylint: disable=import-outside-toplevel
  from numba.core.registry import cpu_target
  sys.modules[BLAS_MODULE] = None  # importing it raises ImportError
  try:
    cpu_target.typing_context.refresh()
    cpu_target.target_context.refresh()
  finally:
    if BLAS_MODULE in sys.modules and sys.modules[BLAS_MODULE] is None:
      del sys.modules[BLAS_MODULE]
  return module


def started() -> bool:
  """Whether this process has switched to the compiled kernels."""
  return _STATE["compiled"] is not None
