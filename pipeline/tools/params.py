"""What ``--threshold`` chooses, and the S-curve behind it.

``python -m pipeline.tools.params --threshold 0.8 --num-perm 128 [--plot
scurve.png]`` prints the chosen bands and rows (the job's own choice, same
flags and defaults), the approximate S-curve threshold (1/b)^(1/r) and, at a
few similarities, P(candidate) = 1-(1-s^r)^b and P(edge): the probability
that the verify mode also keeps the pair. With ``--plot`` it also draws the
S-curve of the chosen (b, r) next to 64x2, 32x4, 16x8 and 8x16 into that
PNG, with the threshold marked.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import numpy as np

from pipeline.options import add_detection_arguments
from pipeline.tools import config_from_args, parse_args, run_tool, tool_parser
from transforms.config import (MIN_CANDIDATE_PROBABILITY, ConfigError,
                               DedupConfig)
from transforms.kernels import lsh as lsh_kernels

COMPARED = ((64, 2), (32, 4), (16, 8), (8, 16))
SIMILARITIES = (0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def edge_probability(s, config: DedupConfig) -> np.ndarray:
  """P(a pair of Jaccard ``s`` becomes an edge) under ``config``."""
  s = np.atleast_1d(np.asarray(s, dtype=np.float64))
  if config.verify == "signature":
    return lsh_kernels.detection_probability(
        s, config.bands, config.rows, config.num_perm,
        lsh_kernels.min_equal_entries(config.threshold, config.num_perm))
  p = lsh_kernels.collision_probability(s, config.bands, config.rows)
  if config.verify == "exact":
    p = p * (s >= config.threshold - 1e-9)
  return p


def describe(config: DedupConfig) -> str:
  """The text ``main`` prints."""
  b, r, t = config.bands, config.rows, config.threshold
  lines = [f"threshold {t}, K={config.num_perm}, fp_weight "
           f"{config.fp_weight}, fn_weight {config.fn_weight}: {b} bands x "
           f"{r} rows (b*r = {b * r}), S-curve threshold (1/b)^(1/r) = "
           f"{config.lsh_threshold:.3f}",
           f"P(candidate | J >= {t}) >= {config.candidate_probability:.4f}"
           f" (P at J = {t}); mean P(candidate) of a pair below it"
           f" {config.mean_false_candidate:.3f}: expected false candidates"
           " per document per such neighbour"
           + (f"; below {MIN_CANDIDATE_PROBABILITY}, what --threshold's own"
              " choice reaches with verification: one true pair in"
              f" {1 / (1 - config.candidate_probability):.0f} at the"
              " threshold is never a candidate"
              if config.verify != "none" and config.candidate_probability
              < MIN_CANDIDATE_PROBABILITY else ""),
           f"verify={config.verify}: P(edge) is P(candidate) and passing "
           "verification",
           "similarity  P(candidate)  P(edge)"]
  s = np.array(SIMILARITIES)
  cand = lsh_kernels.collision_probability(s, b, r)
  for x, pc, pe in zip(s, cand, edge_probability(s, config)):
    lines.append(f"{x:10.2f}  {pc:12.4f}  {pe:7.4f}")
  lines.append("compared: " + ", ".join(
      f"{bb}x{rr} ~{(1 / bb) ** (1 / rr):.2f}" for bb, rr in COMPARED))
  return "\n".join(lines)


def plot(config: DedupConfig, path: str) -> None:
  """Writes the S-curves as a PNG (matplotlib, imported only here)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  s = np.linspace(0, 1, 401)
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for b, r in COMPARED:
    if b * r <= config.num_perm and (b, r) != (config.bands, config.rows):
      ax.plot(s, lsh_kernels.collision_probability(s, b, r), lw=1, alpha=0.6,
              label=f"{b}x{r} (~{(1 / b) ** (1 / r):.2f})")
  ax.plot(s, lsh_kernels.collision_probability(s, config.bands, config.rows),
          lw=2.5, color="black", label=f"chosen {config.bands}x{config.rows}"
          f" (~{config.lsh_threshold:.2f})")
  if config.verify != "none":
    ax.plot(s, edge_probability(s, config), lw=1.5, ls="--", color="black",
            label=f"edge after --verify {config.verify}")
  ax.axvline(config.threshold, color="red", ls=":",
             label=f"threshold {config.threshold}")
  ax.set_xlabel("Jaccard similarity s")
  ax.set_ylabel("probability")
  ax.set_title(f"LSH S-curve 1-(1-s^r)^b, K={config.num_perm}")
  ax.set_xlim(0, 1)
  ax.set_ylim(0, 1.01)
  ax.legend(loc="upper left", fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


# The DedupConfig fields that decide the S-curve.
PARAMS_FLAGS = ("threshold", "num_perm", "fp_weight", "fn_weight", "bands",
                "rows", "verify")


def main(argv: Optional[List[str]] = None) -> int:
  parser = tool_parser("params", __doc__)
  add_detection_arguments(parser, only=PARAMS_FLAGS)
  parser.add_argument("--plot", metavar="PNG", default=None,
                      help="Also draw the S-curves into this PNG file.")
  args = parse_args(parser, argv)
  if isinstance(args, int):
    return args
  try:
    config = config_from_args(args)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(describe(config))
  if args.plot:
    plot(config, args.plot)
    print(f"wrote {args.plot}")
  return 0


if __name__ == "__main__":
  run_tool(main)
