"""Benchmark harness (bench/run.py) and the sample-corpus builder."""
