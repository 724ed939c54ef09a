"""The examples in the docstrings of the ``transforms`` package run and hold."""

import doctest
import importlib
import pkgutil

import pytest

import transforms

MODULES = sorted(m.name for m in pkgutil.walk_packages(
    transforms.__path__, prefix="transforms."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
  result = doctest.testmod(importlib.import_module(name))
  assert result.failed == 0, f"{result.failed} examples of {name} fail"


def test_the_examples_are_found():
  with_examples = {
      name for name in MODULES
      if doctest.testmod(importlib.import_module(name)).attempted}
  assert {"transforms.stats", "transforms.read",
          "transforms.kernels.lsh"} <= with_examples
