"""``transforms``' public names: what the README says is importable from it
is, and ``__all__`` lists exactly what it defines."""

import os
import re

import transforms

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                      "README.md")


def _readme():
  with open(README, encoding="utf-8") as f:
    return f.read()


def _stage_table(text):
  """The rows of the README's "Where things are" table."""
  start = text.index("| stage |", text.index("### Where things are"))
  return text[start:text.index("\n\n", start)]


def test_every_exported_name_imports():
  for name in transforms.__all__:
    assert getattr(transforms, name) is not None, name
  assert sorted(transforms.__all__) == sorted(set(transforms.__all__))


def test_readme_building_blocks_are_exported():
  text = _readme()
  blocks = re.search(r"The building blocks \((.*?)\) are importable from",
                     text, re.S).group(1)
  listed = set(re.findall(r"`(\w+)`", blocks))
  table = _stage_table(text)
  in_table = {name for row in table.splitlines()[2:]
              for name in re.findall(r"`([A-Z]\w+)`", row.split("|")[2])}
  example = set(re.findall(r"from transforms import ([\w, ]+)", text))
  imported = {n.strip() for line in example for n in line.split(",")}
  assert listed and in_table and imported
  # FinalizeOutput is the job's own last step, not a building block.
  missing = (listed | (in_table - {"FinalizeOutput"}) | imported) - set(
      transforms.__all__)
  assert not missing, f"documented but not exported: {sorted(missing)}"
  undocumented = set(transforms.__all__) - listed - in_table - imported - {
      "ClusterInfo", "ConfigError", "Document", "Rejected"}
  assert not undocumented, f"exported but not in the README: {undocumented}"


def test_where_things_are_points_at_existing_files():
  text = _readme()
  table = _stage_table(text)
  root = os.path.dirname(README)
  for path in re.findall(r"`((?:transforms/)?(?:kernels/)?\w+\.py)`", table):
    full = path if path.startswith("transforms/") else "transforms/" + path
    assert os.path.isfile(os.path.join(root, full)), path
