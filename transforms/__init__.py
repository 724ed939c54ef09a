"""Composable Beam transforms for MinHash-LSH near-duplicate detection.

Public names are imported lazily so that ``transforms.kernels`` and
``transforms.config`` stay importable without Apache Beam.
"""

import importlib

_EXPORTS = {
    "DedupConfig": "transforms.config",
    "ConfigError": "transforms.config",
    "ReadDocuments": "transforms.documents",
    "Document": "transforms.documents",
    "Rejected": "transforms.documents",
    "Normalize": "transforms.signatures",
    "Shingle": "transforms.signatures",
    "MinHash": "transforms.signatures",
    "ComputeSignatures": "transforms.signatures",
    "BandKey": "transforms.lsh",
    "FindCandidates": "transforms.lsh",
    "VerifyEdges": "transforms.verify",
    "VerifyExact": "transforms.verify",
    "ConnectedComponents": "transforms.components",
    "ClusterInfo": "transforms.select",
    "SelectKept": "transforms.select",
    "WriteResults": "transforms.write",
    "WriteStats": "transforms.write",
    "WriteReport": "transforms.report",
    "NearDedup": "transforms.near_dedup",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'transforms' has no attribute {name!r}")
