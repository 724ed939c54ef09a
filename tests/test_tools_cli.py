"""The offline tools' command lines: help for every flag with its default,
no file written unless asked, quiet end when the reader stops early."""

import os
import re
import subprocess
import sys

import pytest

from pipeline.tools import evaluate, params, truth

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("tool", [params, truth, evaluate],
                         ids=["params", "truth", "evaluate"])
def test_every_flag_has_help_text_and_its_default(tool, capsys):
  assert tool.main(["--help"]) == 0
  text = capsys.readouterr().out
  usage = text.split("\n\n", 1)[0]
  flags = sorted(set(re.findall(r"\[?(--\w+)", usage)))
  assert flags, usage
  for flag in flags:
    entry = re.search(rf"^  {flag}\b[^\n]*\n?((?:                .*\n)*)", text,
                      re.M)
    assert entry, f"{flag} is not described"
    line = entry.group(0)
    described = line.split(flag, 1)[1].split(None, 1)
    assert len(described) > 1 and "(default:" in line, (
        f"{flag} has no help text:\n{line}")


def test_params_writes_no_file_unless_asked(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  assert params.main(["--threshold", "0.7"]) == 0
  assert "bands x" in capsys.readouterr().out
  assert not os.listdir(tmp_path)


def test_output_into_a_reader_that_stops_early_ends_quietly():
  code = ("from pipeline.tools import run_tool\n"
          "def main():\n"
          "  for _ in range(200000):\n"
          "    print('x' * 100)\n"
          "  return 0\n"
          "run_tool(main)\n")
  proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    assert proc.stdout.readline().startswith(b"x")
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
  finally:
    proc.kill()
    proc.wait()
  assert proc.returncode == 0
  assert b"Traceback" not in err and b"BrokenPipe" not in err, err
