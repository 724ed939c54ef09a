"""How the benchmarks run this project's job: each corpus's parameters, the
CLI's arguments for it and the machine's facts. Shared by ``bench/run.py``
and ``bench/beam_share.py`` (which ``bench/run.py`` also imports)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import List, Optional

from pipeline.cli import DEFAULT_RUNNER

NUM_PERM = 128
# Seed-style: the method's experiment (word 3-grams; copies with 10% of tokens
# replaced have Jaccard ~0.5). Web-like: word 5-grams, copies with 1-4% of
# words replaced plus a header (Jaccard ~0.65-0.9).
CORPUS_PARAMS = {"seed-style": {"ngram": 3, "threshold": 0.4},
                 "web-like": {"ngram": 5, "threshold": 0.7}}
# The end-to-end run's size that the targets are set for.
TARGET_E2E_DOCS = 100_000


def bands_rows(threshold: float, num_perm: int) -> dict:
  """(b, r) of DedupConfig's default for ``threshold`` without verification
  (the peers verify nothing, so every system gets the fp/fn-weighted choice,
  not the one that relies on verification); rensa's LSH needs b to divide
  K, so when it does not, the b*r = K split whose S-curve midpoint
  (1/b)^(1/r) is closest to the default's is used for every system."""
  from transforms.config import DedupConfig
  config = DedupConfig(threshold=threshold, num_perm=num_perm, verify="none")
  if num_perm % config.bands == 0 and config.bands * config.rows == num_perm:
    return {"bands": config.bands, "rows": config.rows,
            "chosen_by": "DedupConfig default"}
  splits = [(b, num_perm // b) for b in range(1, num_perm + 1)
            if num_perm % b == 0]
  b, r = min(splits, key=lambda br: abs((1 / br[0]) ** (1 / br[1])
                                        - config.lsh_threshold))
  return {"bands": b, "rows": r,
          "chosen_by": f"closest b*r=K split to DedupConfig default "
                       f"{config.bands}x{config.rows}"}


def corpus_params(name: str, seed: int) -> dict:
  params = dict(CORPUS_PARAMS[name], num_perm=NUM_PERM, seed=seed)
  params.update(bands_rows(params["threshold"], NUM_PERM))
  return params


def pipeline_argv(corpus_dir: str, out_dir: str, params: dict,
                  runner: Optional[str] = None) -> List[str]:
  """``python -m pipeline``'s arguments for ours on a corpus written by
  ``corpora.write``, with the corpus's parameters, on ``runner`` (else the
  CLI's default)."""
  argv = ["--input", os.path.join(corpus_dir, "corpus.jsonl"),
          "--output", out_dir, "--overwrite", "true",
          "--ngram", str(params["ngram"]), "--bands", str(params["bands"]),
          "--rows", str(params["rows"]), "--num_perm", str(NUM_PERM),
          "--threshold", str(params["threshold"]),
          "--seed", str(params["seed"])]
  # Always explicit, so that a test suite's wrapper of main() leaves it be.
  return argv + ["--runner", runner or DEFAULT_RUNNER]


def machine_info() -> dict:
  cpu = platform.processor() or ""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  versions = {}
  for module in ("numpy", "numba", "pyarrow", "apache_beam", "rensa",
                 "datasketch"):
    try:
      versions[module] = importlib.metadata.version(module.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
      versions[module] = None
  return {"cpu": cpu, "cores": os.cpu_count(),
          "python": platform.python_version(),
          "platform": platform.platform(), "load_avg_start": os.getloadavg(),
          "versions": versions}
