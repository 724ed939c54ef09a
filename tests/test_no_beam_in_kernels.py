"""The config, the kernels, the stats vocabulary and the report renderer must
import without Apache Beam."""

import pathlib
import pkgutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent

_SCRIPT = """
import importlib, pkgutil, sys
import transforms.config
import transforms.kernels
import transforms.report_render
import transforms.stats
names = sorted(m.name for m in pkgutil.iter_modules(transforms.kernels.__path__))
for name in names:
  importlib.import_module("transforms.kernels." + name)
print(",".join(names))
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "apache_beam")
assert not loaded, loaded
"""


def test_kernels_import_without_beam():
  kernels = REPO / "transforms" / "kernels"
  expected = sorted(m.name for m in pkgutil.iter_modules([str(kernels)]))
  assert {"hashing", "reference_text", "compiled", "compiled_signature",
          "minhash", "lsh"} <= set(expected)
  result = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().split(",") == expected
