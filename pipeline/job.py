"""Assembly of the batch job: Read → NearDedup → Write (+ stats, report)."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import apache_beam as beam

from pipeline import __version__
from transforms.config import DedupConfig, SubstringsConfig
from transforms.read import InputFile, ReadDocuments
from transforms.finalize import FinalizeOutput, staging_path
from transforms.index import Index, IndexedCorpus, ReadIndex, WriteIndex
from transforms.kernels.minhash import SKETCH_SCHEMES
from transforms.kernels.reference_text import SHINGLE_SCHEME
from transforms.near_dedup import NearDedup
from transforms.report import REPORT_HTML, REPORT_JSON, WriteReport
from transforms.select import ClusterColumns
from transforms.substrings import StrikeSubstrings
from transforms.substrings.dedup import BYTES_STRUCK, DOCS_EMPTIED, DOCS_TOUCHED
from transforms.verify import ServeTextsFromFiles
from transforms.write import (ANNOTATED_DIR, CLUSTERS_DIR, DEDUPED_DIR,
                              REJECTED_DIR, REMOVED_DIR, STATS_FILE,
                              SUBSTRINGS_DIR,
                              OutputOptions, SumCounts, WriteResults,
                              WriteStats)

# What a run leaves under --output (besides _SUCCESS).
OUTPUT_NAMES = (DEDUPED_DIR, CLUSTERS_DIR, REJECTED_DIR, STATS_FILE,
                REPORT_JSON, REPORT_HTML, ANNOTATED_DIR, REMOVED_DIR,
                SUBSTRINGS_DIR)


def run_params(config: DedupConfig) -> dict:
  """The parameters recorded in stats.json."""
  params = dataclasses.asdict(config)
  params["lsh_threshold"] = round(config.lsh_threshold, 6)
  params["shingle_scheme"] = SHINGLE_SCHEME
  params["minhash_scheme"] = SKETCH_SCHEMES[config.sketch]
  return params


def effective_params(config: DedupConfig, input_format: str,
                     text_field: str, id_field: str) -> dict:
  """The effective configuration (flags, --config file and defaults
  merged), as stats.json and an index's manifest record it."""
  return dict(run_params(config), input_format=input_format,
              text_field=text_field, id_field=id_field)


def _with_indexed_files(source: InputFile, indexed, first_new: int):
  """``source``, and after the first new file (index ``first_new``, which
  every run against an index has) the ``indexed`` files: each exactly
  once."""
  yield source
  if source.index == first_new:
    yield from indexed


def build(pipeline: beam.Pipeline, patterns, output: str,
          config: DedupConfig, input_format: str = "auto",
          text_field: str = "text", id_field: str = "id",
          overwrite: bool = False, run_id: str = "run",
          started: Optional[float] = None, against: Optional[Index] = None,
          index_out: Optional[str] = None,
          output_options: OutputOptions = OutputOptions(),
          stale_runs: Sequence[str] = (),
          substrings: SubstringsConfig = SubstringsConfig(),
          near_dup: bool = True):
  """Adds the whole job to ``pipeline``; returns the stats PCollection.

  ``against`` (an :class:`~transforms.index.Index`): deduplicate the inputs
  against it too (their files are numbered after the indexed ones).
  ``index_out``: write an index of this run's documents, and of
  ``against``'s, there (see :mod:`transforms.index`).

  Everything is written under ``output``'s staging folder for ``run_id``
  ``substrings``: strike repeated substrings from the documents near-dup
  keeps (:class:`~transforms.substrings.StrikeSubstrings`); ``near_dup``
  false skips near-dup (no clusters; not with ``against`` or
  ``index_out``).

  (which the caller has claimed with
  :func:`~transforms.finalize.claim_output`: the last step refuses to
  finalize without the claim) and moved into ``output`` by the job's last step
  (:class:`~transforms.finalize.FinalizeOutput`), which replaces an earlier
  run's outputs only if ``overwrite``. ``started`` (``time.time()`` at
  launch) gives the report its ``wall_seconds``; ``output_options``
  selects annotations, the removal list and the output compression;
  ``stale_runs``, dead runs' staging folders that the last step deletes
  (see :func:`~transforms.finalize.claim_output`).
  """
  final = output
  output = staging_path(final, run_id)
  # Per-document elements only for the index's user ids.
  read = pipeline | "ReadDocuments" >> ReadDocuments(
      patterns, input_format, text_field, id_field,
      against.first_file if against else 0, documents=bool(index_out))
  served_files, indexed, old, indexed_paths = read["files"], None, None, None
  if against is not None:
    old = pipeline | "ReadIndex" >> ReadIndex(against, config,
                                             with_rows=bool(index_out))
    # Indexed texts are read back from their files, like the new ones. The
    # indexed files join the stream beside the first new one rather than
    # through a Create and a Flatten, which Beam's Flink runner 2.62 rejects
    # ("PCollectionNodes ... were consumed but never produced").
    served_files = read["files"] | "AddIndexedFiles" >> beam.FlatMap(
        _with_indexed_files, tuple(against.files),
        against.first_file).with_output_types(InputFile)
    indexed = IndexedCorpus(old["keys"], old["signatures"],
                            against.first_new_id)
    indexed_paths = {f.index: f.path for f in against.files}
  # Exact verification reads the candidates back from the input files
  # rather than shuffling every document's text.
  if near_dup:
    dedup = read["batches"] | "NearDedup" >> NearDedup(
        config, ServeTextsFromFiles(served_files, text_field),
        ServeTextsFromFiles(served_files, text_field, id_field), indexed,
        batched=True)
  else:
    dedup = {"clusters": pipeline | "NoClusters" >> beam.Create(
        []).with_output_types(ClusterColumns), "counts": ()}
  results = {"clusters": dedup["clusters"], "rejected": read["rejected"],
             "files": read["files"]}
  struck_counts = ()
  if substrings.enabled:
    removed = dedup["clusters"] | "RemovedIds" >> beam.FlatMap(
        lambda c: c.arrays.doc_ids[~c.arrays.kept].tolist()
    ).with_output_types(int) if near_dup else None
    struck = read["batches"] | "StrikeSubstrings" >> StrikeSubstrings(
        substrings.threshold, substrings.strike, substrings.shards, removed)
    results["spans"] = struck["spans"]
    struck_counts = (*struck["counts"], pipeline | "SubstringZeros" >> (
        beam.Create([(BYTES_STRUCK, 0), (DOCS_TOUCHED, 0),
                     (DOCS_EMPTIED, 0)])))
  written = (results
             | "WriteResults" >> WriteResults(output, id_field,
                                              output_options,
                                              indexed=indexed_paths,
                                              text_field=text_field))
  # The one Flatten of every step's counts (see transforms.metrics.Count).
  counts = ((*read["counts"], *dedup["counts"], *struck_counts, written)
            | "AllCounts" >> beam.Flatten())
  # Output options only when set, so default runs' stats stay as they were.
  params = dict(effective_params(config, input_format, text_field, id_field),
                **output_options.non_default())
  if substrings.enabled:
    params.update(substrings=substrings.threshold,
                  substrings_strike=substrings.strike, near_dup=near_dup)
  totals = counts | "SumCounts" >> SumCounts()
  stats = totals | "WriteStats" >> WriteStats(output, params)
  report = ({"stats": stats, "totals": totals, "clusters": dedup["clusters"],
             "files": read["files"]}
            | "WriteReport" >> WriteReport(
                output, text_field, id_field, config.threshold, started,
                {"inputs": list(patterns), "version": __version__}))
  done = report | "FinalizeOutput" >> FinalizeOutput(
      output, final, OUTPUT_NAMES, overwrite, stale_runs)
  if index_out:
    inputs = {"keys": dedup["keys"], "signatures": dedup["signatures"],
              "clusters": dedup["clusters"], "files": read["files"],
              "users": read["documents"] | "UserIds" >> beam.Map(
                  lambda d: (d.doc_id, d.user_id)),
              "done": done}
    if old is not None:
      inputs.update(old_keys=old["keys"], old_docs=old["docs"])
    _ = inputs | "WriteIndex" >> WriteIndex(
        index_out, config, params, against.files if against else (),
        __version__)
  return stats
