"""Throughput, verdict latency and state bytes of the streaming path.

Runs DeduplicateStream on a TestStream of seed-style documents (30% with a
planted near-copy) on the BundleBasedDirectRunner or Prism, and prints one
JSON line: documents/s (wall time of the whole run, pipeline start
included), verdict counts, the verdict latency distribution (Prism; the
DirectRunner reports only its first bundle's metrics) and the encoded state
bytes per kept document, computed with the job's own coders.

  python bench/streaming.py --runner direct --docs 2000
  python bench/streaming.py --runner prism --docs 1000 --verify exact
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

# pylint: disable=wrong-import-position
import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.engines import find_prism, missing_prism_reason
from tests.corpus import seed_corpus
from tests.stream_harness import Collect, make_test_stream, read_collected
from transforms.config import DedupConfig, StreamConfig
from transforms.kernels import compiled_signature as signature, minhash
from transforms.stream.dedup import PRISM_NO_SPLIT, DeduplicateStream
from transforms.stream.elements import (Arrival, ArrivalCoder, BucketState,
                                        BucketStateCoder, Member, MemberCoder,
                                        Progress, ProgressCoder)


def state_bytes_per_kept(texts, config: DedupConfig, id_chars: int):
  """Encoded bytes a kept document leaves in Buckets (a bucket's cell with
  its representative and clock, plus the 8-byte key, per band) and, until
  its lateness passes, in Verdicts (the done cell)."""
  a, b = minhash.permutations(config.num_perm, config.seed)
  sigs, _ = signature.signature_batch(texts, unit=config.shingle_unit,
                                      ngram=config.ngram, seed=config.seed,
                                      a=a, b=b)
  shingle_counts = [0] * len(texts)
  if config.verify == "exact":
    _, offsets = signature.shingle_sets(texts, unit=config.shingle_unit,
                                        ngram=config.ngram, seed=config.seed)
    shingle_counts = (offsets[1:] - offsets[:-1]).tolist()
  members = [Member("x" * id_chars, 0, sigs[i],
                    np.zeros(shingle_counts[i], np.uint64))
             for i in range(len(texts))]
  rep = np.mean([len(MemberCoder().encode(m)) for m in members])
  cell = np.mean([len(BucketStateCoder().encode(BucketState(m, clock=0)))
                  for m in members])
  return {"representative_bytes": round(float(rep), 1),
          "bucket_bytes_per_kept_doc": round(float(config.bands * (cell + 8)),
                                             1),
          "verdict_done_bytes": len(ProgressCoder().encode(
              Progress(done=True))),
          "arrival_bytes_example": len(ArrivalCoder().encode(
              Arrival(0, config.bands, "signed", texts[0].encode(), 0)))}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runner", choices=("direct", "prism"),
                      default="direct")
  parser.add_argument("--docs", type=int, default=2000)
  parser.add_argument("--mode", choices=("arrival", "event_time"),
                      default="event_time")
  parser.add_argument("--verify", choices=("signature", "exact"),
                      default="signature")
  parser.add_argument("--batch", type=int, default=500,
                      help="documents per TestStream step")
  args = parser.parse_args()
  texts, truth = seed_corpus(n_base=int(args.docs / 1.3) + 1, seed=1)
  texts = texts[:args.docs]
  config = DedupConfig(ngram=3, num_perm=128, bands=32, rows=4,
                       threshold=0.4, verify=args.verify)
  stream = StreamConfig(config, mode=args.mode, settle_ms=1000,
                        dedup_window_ms=10**9, allowed_lateness_ms=10**6)
  events = []
  for start in range(0, len(texts), args.batch):
    events.append(("add", [(f"{i:08d}", texts[i], 1000 + 10 * i)
                           for i in range(start, min(start + args.batch,
                                                     len(texts)))]))
    events.append(("wm", 1000 + 10 * (start + args.batch)))
  if args.runner == "prism":
    if find_prism() is None:
      sys.exit(missing_prism_reason())
    options = ["--runner", "PrismRunner", "--prism_location", find_prism(),
               f"--experiments={PRISM_NO_SPLIT}"]
  else:
    options = ["--runner", "BundleBasedDirectRunner"]
  folder = tempfile.mkdtemp()
  p = beam.Pipeline(options=PipelineOptions(options + ["--streaming"]))
  out = p | make_test_stream(events) | DeduplicateStream(stream)
  _ = out["verdicts"] | beam.ParDo(Collect(folder, "verdicts"))
  started = time.perf_counter()
  result = p.run()
  result.wait_until_finish()
  wall = time.perf_counter() - started
  verdicts = read_collected(folder, "verdicts")
  latency = None
  for d in result.metrics().query()["distributions"]:
    if d.key.metric.name == "stream_verdict_latency_ms":
      v = d.committed or d.attempted
      if v and v.count:
        latency = {"count": v.count, "mean_ms": round(v.sum / v.count, 1),
                   "min_ms": v.min, "max_ms": v.max}
  print(json.dumps({
      "runner": args.runner, "mode": args.mode, "verify": args.verify,
      "docs": len(texts), "wall_s": round(wall, 2),
      "docs_per_s": round(len(texts) / wall, 1),
      "verdicts": len(verdicts),
      "distinct_docs_with_verdict": len({v["id"] for v in verdicts}),
      "duplicates": sum(v["verdict"] == "duplicate" for v in verdicts),
      "planted_pairs": sum(1 for a, b in truth if b < len(texts)),
      "verdict_latency": latency,
      "load_average": os.getloadavg()[0],
      **state_bytes_per_kept(texts[:500], config, 8)}))


if __name__ == "__main__":
  main()
