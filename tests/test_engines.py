"""Prism, Beam's local Go runner: installed by script, found by the CLI,
byte-identical outputs. The whole end-to-end suite also runs on Prism in the
engine tier (``NEARDUP_ENGINE=prism``, see ``tests/engines.py``)."""

import logging
import os
import shutil
import subprocess

import pytest
from apache_beam.options.pipeline_options import (PrismRunnerOptions,
                                                  StandardOptions)

from pipeline import cli, engines
from pipeline.options import DedupOptions
from tests import engines as engine_tier
from tests.corpus import seed_corpus, tree_bytes, write_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "install_prism.sh")
pytestmark = [pytest.mark.engine, pytest.mark.extended]
SEED_ARGS = ["--ngram", "3", "--bands", "32", "--rows", "4", "--threshold",
             "0.4"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  texts, _ = seed_corpus(n_base=200, seed=5)
  path = tmp_path_factory.mktemp("engines") / "in.jsonl"
  write_jsonl(path, texts)
  return str(path)


def test_install_script_is_idempotent_without_go_once_cached(tmp_path):
  prism = engine_tier.require_prism()
  cache = tmp_path / "cache"
  dest = cache / "prism" / f"v{engines.BEAM_VERSION}"
  dest.mkdir(parents=True)
  shutil.copy(prism, dest / "prism")
  # No Go on PATH: a cached binary must be answered without building.
  env = dict(os.environ, NEARDUP_ENGINES_CACHE=str(cache), PATH="/bin:/usr/bin")
  assert shutil.which("go", path=env["PATH"]) is None
  done = subprocess.run([SCRIPT], env=env, capture_output=True, text=True,
                        check=True, timeout=30)
  assert done.stdout.strip() == str(dest / "prism")


def test_install_script_without_go_or_binary_fails_clearly(tmp_path):
  env = dict(os.environ, NEARDUP_ENGINES_CACHE=str(tmp_path),
             PATH="/bin:/usr/bin")
  if shutil.which("go", path=env["PATH"]):
    pytest.skip("go is installed in /usr/bin here")
  done = subprocess.run([SCRIPT], env=env, capture_output=True, text=True,
                        timeout=30)
  assert done.returncode == 1
  assert "Go is not installed" in done.stderr


def test_engines_cache_follows_the_install_scripts_rule(monkeypatch, tmp_path):
  monkeypatch.setenv("NEARDUP_ENGINES_CACHE", str(tmp_path))
  assert engines.prism_path() == os.path.join(
      str(tmp_path), "prism", f"v{engines.BEAM_VERSION}", "prism")
  assert engines.find_prism() is None
  assert "scripts/install_prism.sh" in engines.missing_prism_reason()
  monkeypatch.delenv("NEARDUP_ENGINES_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert engines.engines_cache() == str(tmp_path / "xdg" / "neardup-engines")


def _options(*argv):
  return DedupOptions(["--input", "x", "--output", "y", *argv])


def test_default_runner_is_fnapi_and_prism_runners_get_the_cached_binary():
  prism = engine_tier.require_prism()
  opts = _options()
  assert cli.choose_runner(opts) == "FnApiRunner"
  assert opts.view_as(StandardOptions).runner == cli.DEFAULT_RUNNER
  for runner in ("PrismRunner", "DirectRunner"):
    opts = _options("--runner", runner)
    assert cli.choose_runner(opts) == runner
    assert opts.view_as(PrismRunnerOptions).prism_location == prism
  given = _options("--runner", "PrismRunner", "--prism_location", "/opt/p")
  cli.choose_runner(given)
  assert given.view_as(PrismRunnerOptions).prism_location == "/opt/p"


@pytest.mark.parametrize("runner,script,flag", [
    ("PrismRunner", "scripts/install_prism.sh", "--prism_location"),
    ("FlinkRunner", "scripts/install_flink.sh", "--flink_job_server_jar")])
def test_engine_runner_not_installed_exits_2_naming_the_script(
    monkeypatch, tmp_path, capsys, corpus, runner, script, flag):
  monkeypatch.setenv("NEARDUP_ENGINES_CACHE", str(tmp_path / "empty"))
  code = cli.main(["--input", corpus, "--output", str(tmp_path / "out"),
                   "--runner", runner])
  assert code == 2
  err = capsys.readouterr().err
  assert script in err and flag in err
  assert not (tmp_path / "out").exists()


def _run(corpus, out, *extra):
  assert cli.main(["--input", corpus, "--output", str(out), *SEED_ARGS,
                   *extra]) == 0
  return tree_bytes(str(out))


@pytest.fixture(scope="module")
def fnapi_reference(corpus, tmp_path_factory):
  return _run(corpus, tmp_path_factory.mktemp("ref") / "out",
              "--runner", "FnApiRunner")


def test_prism_runner_outputs_are_byte_identical(corpus, fnapi_reference,
                                                 tmp_path):
  engine_tier.require_prism()
  files = _run(corpus, tmp_path / "out", "--runner", "PrismRunner")
  assert files == fnapi_reference
  assert any(name.startswith("clusters") for name in files)


def test_direct_runner_runs_on_the_cached_prism(corpus, fnapi_reference,
                                                tmp_path, caplog):
  engine_tier.require_prism()
  with caplog.at_level(logging.INFO,
                       logger="apache_beam.runners.direct.direct_runner"):
    files = _run(corpus, tmp_path / "out", "--runner", "DirectRunner")
  messages = [r.getMessage() for r in caplog.records]
  assert "Running pipeline with PrismRunner." in messages
  assert not any("Falling back" in m or "Downloading" in m for m in messages)
  assert files == fnapi_reference


def test_a_job_run_by_a_test_not_marked_e2e_fails(corpus, tmp_path):
  # tests/conftest.py wraps pipeline.cli.main for the whole suite; a test
  # that runs the job unmarked would silently miss the engine tier.
  with pytest.raises(AssertionError, match="mark it @pytest.mark.e2e"):
    cli.main(["--input", corpus, "--output", str(tmp_path / "out")])
  assert not (tmp_path / "out").exists()
