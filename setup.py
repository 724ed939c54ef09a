"""Installable distribution; also what --setup_file ships to Beam workers."""

import pathlib
import re

import setuptools

HERE = pathlib.Path(__file__).parent


def _version():
  # Read, not imported: importing pipeline would need its requirements.
  text = (HERE / "pipeline" / "__init__.py").read_text()
  return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _requirements():
  lines = (HERE / "requirements.txt").read_text().splitlines()
  return [l.strip() for l in lines if l.strip() and not l.startswith("#")]


setuptools.setup(
    name="beam-minhash-neardup",
    version=_version(),
    description="MinHash-LSH near-duplicate detection for text corpora on"
    " Apache Beam (DirectRunner, Dataflow, Flink).",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["pipeline", "pipeline.*",
                                               "transforms", "transforms.*"]),
    python_requires=">=3.10",
    install_requires=_requirements(),
    extras_require={"test": ["pytest"]},
    entry_points={"console_scripts": ["neardup=pipeline.cli:run"]},
)
