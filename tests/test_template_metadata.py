"""Flex Template metadata stays in step with the job's PipelineOptions.

Every ``templates/*/metadata.json`` must be registered in ``TEMPLATES`` with
the options class its job parses; a second (e.g. streaming) template only adds
a line there.
"""

import argparse
import glob
import json
import os
import re

import pytest

from pipeline import options as batch_options
from pipeline import streaming

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Template folder (relative to the repository root) -> (options class, names
# the job requires beyond argparse's ``required``: the CLI checks those itself
# so that Beam, which parses every registered options class, never fails).
TEMPLATES = {
    "templates/dataflow": (batch_options.DedupOptions,
                           getattr(batch_options, "REQUIRED_OPTIONS", ())),
    "templates/dataflow-streaming": (streaming.TemplateOptions,
                                     streaming.TEMPLATE_REQUIRED),
}

# google.dataflow.v1beta3.ParameterType values.
PARAM_TYPES = {
    "DEFAULT", "TEXT", "GCS_READ_BUCKET", "GCS_WRITE_BUCKET", "GCS_READ_FILE",
    "GCS_WRITE_FILE", "GCS_READ_FOLDER", "GCS_WRITE_FOLDER", "PUBSUB_TOPIC",
    "PUBSUB_SUBSCRIPTION", "BIGQUERY_TABLE", "JAVASCRIPT_UDF_FILE",
    "SERVICE_ACCOUNT", "MACHINE_TYPE", "KMS_KEY_NAME", "WORKER_REGION",
    "WORKER_ZONE", "BOOLEAN", "ENUM", "NUMBER",
}
PARAM_KEYS = {"name", "label", "helpText", "isOptional", "regexes",
              "paramType", "defaultValue", "groupName", "parentName",
              "parentTriggerValues", "enumOptions", "customMetadata",
              "hiddenUi"}


def option_actions(options_class, required=()):
  """``{dest: argparse.Action}`` for every option the class declares; the
  names in ``required`` are marked required."""
  # pylint: disable=protected-access
  parser = argparse.ArgumentParser(add_help=False)
  options_class._add_argparse_args(parser)
  actions = {a.dest: a for a in parser._actions if a.dest not in batch_options.CLI_ONLY}
  for name in required:
    actions[name].required = True
  return actions


def as_template_string(value) -> str:
  """How a default is spelled as a template parameter value."""
  if isinstance(value, bool):
    return "true" if value else "false"
  return str(value)


def known_parameters(meta, actions):
  """Parameters naming a real option (the others fail their own test)."""
  return [p for p in meta["parameters"] if p["name"] in actions]


def load_metadata(folder):
  with open(os.path.join(ROOT, folder, "metadata.json"), encoding="utf-8") as f:
    return json.load(f)


def test_every_template_folder_is_registered():
  found = {os.path.relpath(os.path.dirname(p), ROOT).replace(os.sep, "/")
           for p in glob.glob(os.path.join(ROOT, "templates", "**",
                                           "metadata.json"), recursive=True)}
  assert found == set(TEMPLATES), (
      "register each template folder with its options class in TEMPLATES")


@pytest.fixture(params=sorted(TEMPLATES), name="template")
def fixture_template(request):
  folder = request.param
  return folder, load_metadata(folder), option_actions(*TEMPLATES[folder])


def test_metadata_shape(template):
  folder, meta, _ = template
  assert meta["name"].strip() and meta["description"].strip()
  names = [p["name"] for p in meta["parameters"]]
  assert len(names) == len(set(names)), f"{folder}: duplicate parameters"
  for param in meta["parameters"]:
    assert set(param) <= PARAM_KEYS, f"{folder}: unknown keys in {param}"
    assert param["label"].strip() and param["helpText"].strip(), param["name"]
    assert isinstance(param["isOptional"], bool), param["name"]
    assert param.get("paramType", "TEXT") in PARAM_TYPES, param["name"]
    for regex in param.get("regexes", []):
      re.compile(regex)
    if "defaultValue" in param:
      assert isinstance(param["defaultValue"], str), param["name"]


def test_parameters_are_real_options(template):
  folder, meta, actions = template
  unknown = [p["name"] for p in meta["parameters"] if p["name"] not in actions]
  assert not unknown, f"{folder}: not options of the job: {unknown}"


def test_every_option_is_a_parameter(template):
  folder, meta, actions = template
  missing = set(actions) - {p["name"] for p in meta["parameters"]}
  assert not missing, f"{folder}: options missing from metadata: {missing}"


def test_required_options_are_not_optional(template):
  folder, meta, actions = template
  assert any(a.required for a in actions.values()), (
      f"{folder}: the job requires no option? (see TEMPLATES)")
  params = {p["name"]: p for p in meta["parameters"]}
  for dest, action in actions.items():
    if action.required:
      assert dest in params, dest
      assert params[dest]["isOptional"] is False, dest
      assert "defaultValue" not in params[dest], dest
    elif dest in params:
      assert params[dest]["isOptional"] is True, dest


def test_defaults_match(template):
  _, meta, actions = template
  for param in known_parameters(meta, actions):
    action = actions[param["name"]]
    if action.default is None:
      assert "defaultValue" not in param, (
          f"{param['name']} has no default, so the template must not invent"
          " one")
      continue
    assert param.get("defaultValue") == as_template_string(action.default), (
        param["name"])
    # The string a launcher passes on parses back to the very default.
    parse = action.type or str
    assert parse(param["defaultValue"]) == action.default, param["name"]


def test_regexes_accept_defaults_and_choices(template):
  _, meta, actions = template
  for param in known_parameters(meta, actions):
    action = actions[param["name"]]
    values = []
    if action.default is not None:
      values.append(as_template_string(action.default))
    values += [as_template_string(c) for c in action.choices or ()]
    for regex in param.get("regexes", []):
      for value in values:
        assert re.fullmatch(regex, value), (
            f"{param['name']}: {regex!r} rejects {value!r}")


def test_choice_regexes_reject_other_values(template):
  """A choice option's regex admits its choices and nothing else."""
  _, meta, actions = template
  for param in known_parameters(meta, actions):
    choices = actions[param["name"]].choices
    if not choices:
      continue
    assert param.get("regexes"), f"{param['name']}: choices need a regex"
    for regex in param["regexes"]:
      for value in ("", "x", " " + str(choices[0]), str(choices[0]) + "x"):
        if value not in choices:
          assert not re.fullmatch(regex, value), (param["name"], value)
