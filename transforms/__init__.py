"""Composable Beam transforms for MinHash-LSH near-duplicate detection.

The stages in the order the job runs them (one module each, see the README's
"Where things are"): Read → Sign → Band → Collide → Verify → Components →
Select (+ Explain) → Write (+ Report). Public names are imported lazily so
that ``transforms.kernels`` and ``transforms.config`` stay importable without
Apache Beam; ``__all__`` lists them, and a test holds it to the README.
"""

import importlib

__all__ = [
    "BandKey",
    "ClusterInfo",
    "ComputeSignatures",
    "ConfigError",
    "ConnectedComponents",
    "DedupConfig",
    "Document",
    "ExplainClusters",
    "FindCandidates",
    "MinHash",
    "NearDedup",
    "Normalize",
    "ReadDocuments",
    "ReadIndex",
    "ReduceUnverified",
    "Rejected",
    "SelectKept",
    "ServeTextsFromFiles",
    "Shingle",
    "SumCounts",
    "VerifyEdges",
    "VerifyExact",
    "WriteIndex",
    "WriteReport",
    "WriteResults",
    "WriteStats",
]

# Name -> the module defining it.
_MODULES = {
    "DedupConfig": "transforms.config",
    "ConfigError": "transforms.config",
    "ReadDocuments": "transforms.read",
    "Document": "transforms.read",
    "Rejected": "transforms.read",
    "Normalize": "transforms.sign",
    "Shingle": "transforms.sign",
    "MinHash": "transforms.sign",
    "ComputeSignatures": "transforms.sign",
    "BandKey": "transforms.band",
    "FindCandidates": "transforms.collide",
    "VerifyEdges": "transforms.verify",
    "VerifyExact": "transforms.verify",
    "ReduceUnverified": "transforms.verify",
    "ServeTextsFromFiles": "transforms.verify",
    "ConnectedComponents": "transforms.components",
    "ClusterInfo": "transforms.select",
    "SelectKept": "transforms.select",
    "ExplainClusters": "transforms.explain",
    "WriteResults": "transforms.write",
    "WriteStats": "transforms.write",
    "SumCounts": "transforms.write",
    "WriteReport": "transforms.report",
    "NearDedup": "transforms.near_dedup",
    "ReadIndex": "transforms.index",
    "WriteIndex": "transforms.index",
}


def __getattr__(name):
  if name in _MODULES:
    return getattr(importlib.import_module(_MODULES[name]), name)
  raise AttributeError(f"module 'transforms' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(__all__))
