"""Assembly of the batch job: Read → NearDedup → Write (+ stats, report)."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Optional

import apache_beam as beam

from pipeline import __version__
from transforms.config import DedupConfig
from transforms.read import ReadDocuments
from transforms.finalize import FinalizeOutput, staging_path
from transforms.kernels.minhash import SKETCH_SCHEMES
from transforms.kernels.reference_text import SHINGLE_SCHEME
from transforms.near_dedup import NearDedup
from transforms.report import REPORT_HTML, REPORT_JSON, WriteReport
from transforms.verify import ServeTextsFromFiles
from transforms.write import (ANNOTATED_DIR, CLUSTERS_DIR, DEDUPED_DIR,
                              REJECTED_DIR, REMOVED_DIR, STATS_FILE,
                              OutputOptions, WriteResults, WriteStats)

# What a run leaves under --output (besides _SUCCESS).
OUTPUT_NAMES = (DEDUPED_DIR, CLUSTERS_DIR, REJECTED_DIR, STATS_FILE,
                REPORT_JSON, REPORT_HTML, ANNOTATED_DIR, REMOVED_DIR)


def run_params(config: DedupConfig) -> dict:
  """The parameters recorded in stats.json."""
  params = dataclasses.asdict(config)
  params["lsh_threshold"] = round(config.lsh_threshold, 6)
  params["shingle_scheme"] = SHINGLE_SCHEME
  params["minhash_scheme"] = SKETCH_SCHEMES[config.sketch]
  return params


def build(pipeline: beam.Pipeline, patterns, output: str,
          config: DedupConfig, input_format: str = "auto",
          text_field: str = "text", id_field: str = "id",
          overwrite: bool = False, run_id: Optional[str] = None,
          started: Optional[float] = None,
          output_options: OutputOptions = OutputOptions()):
  """Adds the whole job to ``pipeline``; returns the stats PCollection.

  Everything is written under ``output``'s staging folder for ``run_id``
  (a fresh one when None) and moved into ``output`` by the job's last step
  (:class:`~transforms.finalize.FinalizeOutput`), which replaces an earlier
  run's outputs only if ``overwrite``. ``started`` (``time.time()`` at
  launch) gives the report its ``wall_seconds``; ``output_options``
  selects annotations, the removal list and the output compression.
  """
  final = output
  output = staging_path(final, run_id or uuid.uuid4().hex[:16])
  read = pipeline | "ReadDocuments" >> ReadDocuments(
      patterns, input_format, text_field, id_field)
  texts = read["documents"] | "DocText" >> beam.Map(
      lambda d: (d.doc_id, d.text))
  # Exact verification reads the candidates back from the input files
  # rather than shuffling every document's text.
  dedup = texts | "NearDedup" >> NearDedup(
      config, ServeTextsFromFiles(read["files"], text_field),
      ServeTextsFromFiles(read["files"], text_field, id_field))
  written = ({"clusters": dedup["clusters"], "rejected": read["rejected"],
              "files": read["files"]}
             | "WriteResults" >> WriteResults(output, id_field,
                                              output_options))
  counts = ((read["counts"], dedup["counts"], written)
            | "AllCounts" >> beam.Flatten())
  # The effective configuration (flags, --config file and defaults merged).
  # Output options only when set, so default runs' stats stay as they were.
  params = dict(run_params(config), input_format=input_format,
                text_field=text_field, id_field=id_field,
                **output_options.non_default())
  stats = counts | "WriteStats" >> WriteStats(output, params)
  report = ({"stats": stats, "counts": counts, "clusters": dedup["clusters"],
             "files": read["files"]}
            | "WriteReport" >> WriteReport(
                output, text_field, id_field, config.threshold, started,
                {"inputs": list(patterns), "version": __version__}))
  _ = report | "FinalizeOutput" >> FinalizeOutput(output, final, OUTPUT_NAMES,
                                                  overwrite)
  return stats
