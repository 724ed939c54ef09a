"""The sdist that ``--setup_file`` stages installs and runs on its own.

Beam's stager builds ``python setup.py sdist`` (``python -m build`` when that
is installed) and workers pip-install it, so the tarball must carry every
package and the files setup.py reads. Offline: the fresh venv sees the
site-packages of the environment running the tests (a virtualenv's own, not
its base interpreter's), so nothing is downloaded.
"""

import importlib.util
import os
import site
import subprocess
import sys
import tarfile

import pytest

pytestmark = pytest.mark.extended

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 120


def run(args, **kwargs):
  result = subprocess.run(args, capture_output=True, text=True,
                          timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
                          check=False, **kwargs)
  assert result.returncode == 0, (
      f"{args} exited {result.returncode}\n{result.stdout[-3000:]}\n"
      f"{result.stderr[-3000:]}")
  return result


def outer_site_dirs():
  """The site-packages folders of the interpreter running the tests."""
  dirs = list(site.getsitepackages())
  if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
    dirs.append(site.getusersitepackages())
  return dirs


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
  """The project's sdist, built from the repository without writing to it
  (the egg-info goes to the temporary folder too)."""
  out = tmp_path_factory.mktemp("sdist")
  run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(out),
       "sdist", "--dist-dir", str(out)], cwd=ROOT)
  tarballs = sorted(out.glob("*.tar.gz"))
  assert len(tarballs) == 1, tarballs
  return tarballs[0]


def test_sdist_holds_packages_and_the_files_setup_reads(sdist):
  with tarfile.open(sdist) as tar:
    names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
  for required in ("setup.py", "README.md", "requirements.txt",
                   "pipeline/__init__.py", "pipeline/__main__.py",
                   "pipeline/cli.py", "pipeline/options.py",
                   "transforms/__init__.py", "transforms/kernels/__init__.py"):
    assert required in names, f"{required} missing from {sdist.name}"
  # Every module of the source tree ships, kernels included.
  for package in ("pipeline", "transforms", "transforms/kernels"):
    for name in os.listdir(os.path.join(ROOT, package)):
      if name.endswith(".py"):
        assert f"{package}/{name}" in names, f"{package}/{name} missing"


def test_sdist_installs_and_runs_outside_the_repository(sdist, tmp_path):
  if importlib.util.find_spec("wheel") is None:
    pytest.fail("pip builds the sdist with setuptools' bdist_wheel, which"
                " needs the 'wheel' package: pip install -r"
                " requirements-dev.txt")
  venv = tmp_path / "venv"
  # Not --system-site-packages: from inside a virtualenv that would be the
  # base interpreter's packages, which need not have wheel, Beam or even
  # pip. A .pth file adds exactly the packages of the interpreter running
  # the tests; its pip installs into whichever interpreter runs it.
  run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
  python = str(venv / "bin" / "python")
  purelib = run([python, "-c", "import sysconfig;"
                 " print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
  with open(os.path.join(purelib, "_tests_outer_env.pth"), "w",
            encoding="utf-8") as f:
    f.write("\n".join(outer_site_dirs()) + "\n")
  run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
       "--no-index", "--disable-pip-version-check", "-q", str(sdist)],
      cwd=str(tmp_path))

  # Outside the repository, so only the installed copy can be imported.
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  where = run([python, "-c", "import pipeline, transforms.kernels;"
               " print(pipeline.__file__)"], cwd=str(elsewhere), env=env)
  assert where.stdout.strip().startswith(str(venv)), where.stdout

  shown = run([python, "-m", "pipeline", "--help"], cwd=str(elsewhere),
              env=env)
  assert "--input" in shown.stdout and "--lsh_shards" in shown.stdout

  script = venv / "bin" / "neardup"
  assert script.exists(), "console script 'neardup' not installed"
  shown = run([str(script), "--help"], cwd=str(elsewhere), env=env)
  assert "--input" in shown.stdout
