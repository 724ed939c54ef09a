"""The streaming job end to end against the Pub/Sub emulator: JSON messages
in through a subscription, one JSON verdict per document out on a topic.

Runs on the BundleBasedDirectRunner in streaming mode (the one local runner
whose ReadFromPubSub/WriteToPubSub run natively; its watermark for Pub/Sub
is the wall clock, so event-time timers fire for real). The emulator (Google
Cloud SDK component, Java) is started here in its own process group and
stopped by pid even when the test fails; the test skips, saying why, where
the emulator, Java or the client library is missing.
"""

import json
import os
import shutil
import subprocess
import time

import pytest

from tests.services import Service, free_port

pytestmark = pytest.mark.extended

PROJECT = "neardup-test"
START_TIMEOUT_S = 90
RESULT_TIMEOUT_S = 120
WORDS = [f"w{i}" for i in range(60)]
BASE = " ".join(WORDS)
COPY = " ".join(WORDS[:57] + ["x1", "x2", "x3"])
OTHER = " ".join(f"z{i}" for i in range(60))


def emulator_command(port):
  """The emulator's start command, or a reason string when it is absent."""
  if shutil.which("java") is None:
    return "Java is not installed (the Pub/Sub emulator needs it)"
  gcloud = shutil.which("gcloud")
  if gcloud is None:
    return "the Google Cloud SDK (gcloud) is not installed"
  root = subprocess.run(
      [gcloud, "info", "--format=value(installation.sdk_root)"],
      capture_output=True, text=True, timeout=60).stdout.strip()
  script = os.path.join(root, "platform", "pubsub-emulator", "bin",
                        "cloud-pubsub-emulator")
  if not os.path.isfile(script):
    return ("the Pub/Sub emulator is not installed: gcloud components"
            " install pubsub-emulator")
  return [script, "--host=127.0.0.1", f"--port={port}"]


@pytest.fixture(name="emulator", scope="module")
def fixture_emulator(tmp_path_factory):
  """``host:port`` of a running emulator, with PUBSUB_EMULATOR_HOST set."""
  pytest.importorskip("google.cloud.pubsub",
                      reason="google-cloud-pubsub is not installed")
  port = free_port()
  command = emulator_command(port)
  if isinstance(command, str):
    pytest.skip(command)
  emulator = Service("pubsub-emulator", command, port,
                     str(tmp_path_factory.mktemp("pubsub")))
  previous = os.environ.get("PUBSUB_EMULATOR_HOST")
  try:
    emulator.wait_listening(START_TIMEOUT_S)
    os.environ["PUBSUB_EMULATOR_HOST"] = f"127.0.0.1:{port}"
    yield os.environ["PUBSUB_EMULATOR_HOST"]
  finally:
    if previous is None:
      os.environ.pop("PUBSUB_EMULATOR_HOST", None)
    else:
      os.environ["PUBSUB_EMULATOR_HOST"] = previous
    emulator.stop()


def make_topic(publisher, subscriber, name):
  topic = publisher.topic_path(PROJECT, name)
  publisher.create_topic(name=topic)
  sub = subscriber.subscription_path(PROJECT, name + "-sub")
  subscriber.create_subscription(name=sub, topic=topic)
  return topic, sub


def pull_until(subscriber, sub, count, timeout_s):
  """Messages pulled (and acked) from ``sub`` until ``count`` came or the
  time is up."""
  got = []
  deadline = time.monotonic() + timeout_s
  while len(got) < count and time.monotonic() < deadline:
    response = subscriber.pull(subscription=sub, max_messages=100,
                               timeout=10)
    if response.received_messages:
      got += [m.message for m in response.received_messages]
      subscriber.acknowledge(subscription=sub, ack_ids=[
          m.ack_id for m in response.received_messages])
    else:
      time.sleep(0.5)
  return got


@pytest.mark.parametrize("mode", [
    "event_time", pytest.param("arrival", marks=pytest.mark.slow)])
def test_pubsub_verdicts_against_the_emulator(emulator, mode):
  if mode == "arrival" and os.environ.get("NEARDUP_FULL") != "1":
    pytest.skip("quick form: NEARDUP_FULL=1 also runs arrival mode")
  # pylint: disable=import-outside-toplevel
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
  from google.cloud import pubsub

  from pipeline import streaming

  publisher = pubsub.PublisherClient()
  subscriber = pubsub.SubscriberClient()
  in_topic, in_sub = make_topic(publisher, subscriber, f"docs-{mode}")
  out_topic, out_sub = make_topic(publisher, subscriber, f"verdicts-{mode}")
  options = PipelineOptions([
      "--runner", "BundleBasedDirectRunner", "--streaming",
      "--input_subscription", in_sub, "--output_topic", out_topic,
      "--mode", mode, "--settle", "1s", "--allowed_lateness", "1m",
      "--ngram", "3", "--num_perm", "64", "--bands", "16", "--rows", "4",
      "--threshold", "0.5", "--verify", "signature"])
  streaming.check_io(options)
  p = beam.Pipeline(options=options)
  streaming.build(p, options, streaming.stream_config(options))
  result = p.run()
  try:
    messages = [{"id": "a", "text": BASE}, {"id": "c", "text": OTHER},
                {"id": "b", "text": COPY}, {"id": "b", "text": COPY}]
    for i, message in enumerate(messages):
      publisher.publish(in_topic, json.dumps(message).encode()).result()
      if i == 0:
        # b's event time (its publish time) must come after a's.
        time.sleep(1.5)
    publisher.publish(in_topic, b"{not json").result()
    got = pull_until(subscriber, out_sub, 4, RESULT_TIMEOUT_S)
    # Anything extra (a second verdict for the redelivered b) comes soon.
    got += pull_until(subscriber, out_sub, 1, 3)
  finally:
    result.cancel()
  verdicts = [json.loads(m.data) for m in got]
  by_id = {v.get("id"): v for v in verdicts if v["verdict"] != "rejected"}
  assert len(by_id) == len(verdicts) - 1 == 3, verdicts
  assert by_id["a"]["verdict"] == "kept"
  assert by_id["c"]["verdict"] == "kept"
  assert by_id["b"]["verdict"] == "duplicate"
  assert by_id["b"]["duplicate_of"] == "a"
  assert by_id["b"]["similarity"] >= 0.5
  rejected = [v for v in verdicts if v["verdict"] == "rejected"]
  assert rejected[0]["reason"].startswith("malformed_json")
  assert rejected[0]["source"] == in_sub
