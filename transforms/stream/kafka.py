"""Kafka in and out of the streaming graph, through Beam's cross-language
KafkaIO (Java; an expansion service builds it, the runner runs it).

:class:`ReadKafkaRecords` reads topics as :class:`RawRecord` (for
:class:`~transforms.stream.messages.ParseRecords`); :class:`WriteKafkaRecords`
writes ``(key, value)`` byte pairs to a topic. Both take any expansion
service Beam takes (an address, or a ``JavaJarExpansionService``).

Why not Beam Python's ``ReadFromKafka``: Beam Python 2.77 sends three
configuration fields (``dynamic_read_poll_interval_seconds``,
``consumer_factory_fn_class``, ``consumer_factory_fn_params``) that the Java
KafkaIO of 2.62 (the newest Beam Java served here, see
``templates/flink/versions.env``) has no setters for, and the expansion
fails. :class:`ReadKafkaRecords` asks for the same transform (its URN) with
the fields that 2.62 and later take.
"""

import re
from typing import (Dict, List, Mapping, NamedTuple, Optional, Sequence,
                    Tuple)

import apache_beam as beam
from apache_beam.io.kafka import WriteToKafka
from apache_beam.transforms.external import (ExternalTransform,
                                             NamedTupleBasedPayloadBuilder)

from transforms.stream.messages import RawRecord

READ_URN = "beam:transform:org.apache.beam:kafka_read_with_metadata:v1"
BYTES_DESERIALIZER = (
    "org.apache.kafka.common.serialization.ByteArrayDeserializer")
BYTES_SERIALIZER = "org.apache.kafka.common.serialization.ByteArraySerializer"
# KafkaIO's timestamp policies: the record's CreateTime or LogAppendTime
# (the watermark follows them and, once the reader has caught up, the wall
# clock), or the time the reader sees the record.
TIMESTAMP_POLICIES = ("CreateTime", "LogAppendTime", "ProcessingTime")
# Kafka's own rule for topic names.
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class KafkaReadConfig(NamedTuple):
  """The read's configuration as KafkaIO 2.62's external builder takes it
  (field names and order are the cross-language schema)."""
  consumer_config: Mapping[str, str]
  topics: List[str]
  key_deserializer: str
  value_deserializer: str
  start_read_time: Optional[int]
  max_num_records: Optional[int]
  max_read_time: Optional[int]
  commit_offset_in_finalize: bool
  timestamp_policy: str


def check_topic(name: str, flag: str) -> None:
  """Raises ValueError unless ``name`` is a legal Kafka topic name."""
  if not _TOPIC_NAME.fullmatch(name or "") or name in (".", ".."):
    raise ValueError(
        f"{flag} {name!r} is not a Kafka topic name (1-249 of A-Z a-z 0-9 ."
        " _ -); a Pub/Sub topic is projects/P/topics/T.")


def parse_config(pairs: Optional[Sequence[str]], flag: str) -> Dict[str, str]:
  """``["key=value", ...]`` as a dict; raises ValueError naming ``flag`` for
  an entry without ``=`` or with an empty key."""
  config = {}
  for pair in pairs or ():
    key, sep, value = pair.partition("=")
    if not sep or not key.strip():
      raise ValueError(f"{flag} {pair!r}: give key=value, e.g."
                       f" {flag} max.poll.records=500")
    config[key.strip()] = value
  return config


def consumer_config(bootstrap_servers: str,
                    overrides: Mapping[str, str]) -> Dict[str, str]:
  """The consumer's configuration: from the earliest offset unless told
  otherwise (a dedup job started after its feed must not skip what is
  already there), ``overrides`` last."""
  return {"bootstrap.servers": bootstrap_servers,
          "auto.offset.reset": "earliest", **overrides}


class ReadKafkaRecords(beam.PTransform):
  """Kafka records of ``topics`` → :class:`RawRecord`, stamped by
  ``timestamp_policy``: ``source`` and ``fallback_id`` are
  ``kafka:<topic>/<partition>/<offset>`` (a rejection names its record; an
  id stable across redeliveries), ``row`` the offset, ``data`` the value
  (empty for a null one, which the parser rejects).

  Offsets are committed when a checkpoint finalizes only if the consumer
  configuration has a ``group.id`` (KafkaIO needs one to commit).

  Args:
    bootstrap_servers: ``host:port[,host:port]``.
    topics: the topics to read.
    expansion_service: where KafkaIO is expanded (an address or a Beam
      expansion-service object).
    config: consumer configuration, over :func:`consumer_config`'s.
    timestamp_policy: one of ``TIMESTAMP_POLICIES``.
    max_num_records: stop after this many records (a bounded read).
  """

  def __init__(self, bootstrap_servers: str, topics: Sequence[str],
               expansion_service, config: Optional[Mapping[str, str]] = None,
               timestamp_policy: str = "CreateTime",
               max_num_records: Optional[int] = None):
    super().__init__()
    if timestamp_policy not in TIMESTAMP_POLICIES:
      raise ValueError(f"timestamp_policy {timestamp_policy!r}: one of"
                       f" {', '.join(TIMESTAMP_POLICIES)}")
    self._payload = KafkaReadConfig(
        consumer_config=consumer_config(bootstrap_servers, config or {}),
        topics=list(topics), key_deserializer=BYTES_DESERIALIZER,
        value_deserializer=BYTES_DESERIALIZER, start_read_time=None,
        max_num_records=max_num_records, max_read_time=None,
        commit_offset_in_finalize="group.id" in (config or {}),
        timestamp_policy=timestamp_policy)
    self._expansion_service = expansion_service

  def expand(self, pbegin):
    rows = pbegin | "ReadKafka" >> ExternalTransform(
        READ_URN, NamedTupleBasedPayloadBuilder(self._payload),
        self._expansion_service)
    return rows | "KafkaRecords" >> beam.Map(kafka_record).with_output_types(
        RawRecord)


def kafka_record(row) -> RawRecord:
  """A KafkaIO record row (topic, partition, offset, value, ...) as a
  :class:`RawRecord`."""
  where = f"kafka:{row.topic}/{row.partition}/{row.offset}"
  return RawRecord(where, row.offset, where, row.value or b"")


def _bytes_pair(pair) -> Tuple[bytes, bytes]:
  key, value = pair
  return bytes(key), bytes(value)


class WriteKafkaRecords(beam.PTransform):
  """``(key, value)`` byte pairs → ``topic``.

  Args:
    bootstrap_servers: ``host:port[,host:port]``.
    topic: the topic written.
    expansion_service: as :class:`ReadKafkaRecords`'.
    config: producer configuration, over ``bootstrap.servers``.
  """

  def __init__(self, bootstrap_servers: str, topic: str, expansion_service,
               config: Optional[Mapping[str, str]] = None):
    super().__init__()
    self._config = {"bootstrap.servers": bootstrap_servers, **(config or {})}
    self._topic = topic
    self._expansion_service = expansion_service

  def expand(self, pairs):
    # Typed, so that the pairs cross to Java in Beam's portable KV coder.
    typed = pairs | "KeyValueBytes" >> beam.Map(_bytes_pair).with_output_types(
        Tuple[bytes, bytes])
    return typed | "WriteKafka" >> WriteToKafka(
        self._config, self._topic, key_serializer=BYTES_SERIALIZER,
        value_serializer=BYTES_SERIALIZER,
        expansion_service=self._expansion_service)
