#!/usr/bin/env python3
"""Freezes two real-text quality corpora from registry packages into
tests/data/ (see tests/data/README.md).

Usage: ``python tests/data/build_package_corpora.py pypi|npm [--cache
DIR]`` (run once; the committed files are the reference, because what a
registry serves changes).

* ``pypi``: the README (the ``Description`` body of the wheel's METADATA) of
  every distribution pinned in ``pypi_corpus_packages.txt``, fetched with
  ``pip download --no-deps --only-binary :all:``: typing-stub, boto3-stub,
  pytest, flake8, Sphinx and Django plugin families, whose READMEs are
  generated from shared templates or copied from each other and edited.
* ``npm``: the README of every package pinned in
  ``npm_corpus_packages.txt``, from the tarball ``npm pack`` fetches:
  DefinitelyTyped's ``@types/*`` (generated from one template), Babel's
  plugins and the AWS SDK's clients (each family from its own template,
  filled in and edited per package).

Texts are cut into 40-400-word documents with bench/make_sample.py's
chunker (shorter texts stay whole); no variant is planted, every edit is the
authors'. Texts equal after normalisation are kept once. Each corpus is
``<name>_corpus.jsonl.xz`` (``{"id", "text", "source"}`` per document; an id
starts with its source) with ``<name>_corpus_manifest.tsv``: per source its
package, version, the downloaded file, the member path in it, the package's
licence and the file's SHA-256.
"""

from __future__ import annotations

import argparse
import csv
import email.parser
import glob
import hashlib
import io
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
sys.path.insert(0, ROOT)

# pylint: disable=wrong-import-position
from tests.corpus import DATA, _make_sample  # noqa: E402

COLUMNS = ("source", "package", "version", "file", "member", "licence",
           "documents", "sha256")
# At most this many documents per source, so one huge README (a boto3 stub
# lists hundreds of methods) cannot dominate a corpus.
MAX_PER_SOURCE = 40


def _sha256(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def pypi_sources(cache):
  """``(source, text, row)`` per wheel of the pinned list."""
  with open(os.path.join(DATA, "pypi_corpus_packages.txt"),
            encoding="utf-8") as f:
    wanted = [line.strip() for line in f if line.strip()]
  for spec in wanted:
    name, version = spec.split("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    def wheels():
      return sorted(p for p in glob.glob(os.path.join(cache, "*.whl"))
                    if os.path.basename(p).lower().startswith(
                        f"{stem}-{version}-"))
    if not wheels():
      subprocess.run(["pip", "download", "-q", "--no-deps", "--only-binary",
                      ":all:", "-d", cache, spec], check=True)
    path = wheels()[0]
    with zipfile.ZipFile(path) as wheel:
      member = next(n for n in wheel.namelist()
                    if n.endswith(".dist-info/METADATA"))
      meta = email.parser.Parser().parsestr(
          wheel.read(member).decode("utf-8", "replace"))
    text = meta.get_payload() or meta.get("Description") or ""
    licence = (meta.get("License-Expression")
               or "; ".join(c.split("::")[-1].strip()
                            for c in meta.get_all("Classifier", [])
                            if c.startswith("License ::"))
               or (meta.get("License") or "").strip()[:80]
               or "not stated")
    yield (f"{name}-{version}", text, {
        "package": name, "version": version, "file": os.path.basename(path),
        "member": member, "licence": licence, "sha256": _sha256(path)})


def npm_sources(cache):
  """``(source, text, row)`` per package tarball of the pinned list."""
  with open(os.path.join(DATA, "npm_corpus_packages.txt"),
            encoding="utf-8") as f:
    wanted = [line.strip() for line in f if line.strip()]
  for spec in wanted:
    name, version = spec.rsplit("@", 1)
    tarball = os.path.join(
        cache, f"{name.lstrip('@').replace('/', '-')}-{version}.tgz")
    if not os.path.exists(tarball):
      subprocess.run(["npm", "pack", "-q", "--pack-destination", cache, spec],
                     check=True, capture_output=True)
    with tarfile.open(tarball) as tar:
      names = {m.name: m for m in tar.getmembers() if m.isfile()}
      readme = sorted(n for n in names
                      if re.fullmatch(r"[^/]+/readme(\.\w+)?", n, re.I))
      meta = json.loads(tar.extractfile(names[next(
          n for n in names if re.fullmatch(r"[^/]+/package\.json", n))])
                        .read())
      if not readme:
        continue
      text = tar.extractfile(names[readme[0]]).read().decode("utf-8",
                                                             "replace")
    licence = meta.get("license") or "not stated"
    yield (spec, text, {
        "package": name, "version": version,
        "file": os.path.basename(tarball), "member": readme[0],
        "licence": licence if isinstance(licence, str) else json.dumps(
            licence), "sha256": _sha256(tarball)})


BUILDERS = {"pypi": pypi_sources, "npm": npm_sources}


def build(name, cache):
  from transforms.kernels.reference_text import normalize_texts
  ms = _make_sample()
  docs, rows = [], {}
  for source, text, row in BUILDERS[name](cache):
    text = text.strip()
    if not text:
      continue
    if ms.MIN_WORDS <= len(text.split()) <= ms.MAX_WORDS:
      pieces = [(source, text)]
    else:
      pieces = [(f"{source}#{i:03d}", c)
                for i, c in enumerate(ms.chunk(text))][:MAX_PER_SOURCE]
    docs.extend((doc_id, piece, source) for doc_id, piece in pieces)
    rows[source] = row
  seen, out, counts = set(), [], {}
  for doc, norm in zip(docs, normalize_texts([d[1] for d in docs])
                       .to_pylist()):
    if norm.strip() and norm not in seen:
      seen.add(norm)
      out.append(doc)
      counts[doc[2]] = counts.get(doc[2], 0) + 1
  corpus = os.path.join(DATA, f"{name}_corpus.jsonl.xz")
  with lzma.open(corpus, "wt", encoding="utf-8", preset=9) as f:
    for doc_id, text, source in out:
      f.write(json.dumps({"id": doc_id, "text": text, "source": source},
                         ensure_ascii=False) + "\n")
  with open(os.path.join(DATA, f"{name}_corpus_manifest.tsv"), "w",
            encoding="utf-8", newline="") as f:
    table = csv.writer(f, delimiter="\t", lineterminator="\n")
    table.writerow(COLUMNS)
    for source in sorted(counts):
      row = rows[source]
      # A licence field may be a whole licence text: one line of it.
      table.writerow([source, row["package"], row["version"], row["file"],
                      row["member"], " ".join(row["licence"].split())[:200],
                      counts[source], row["sha256"]])
  print(f"{name}: {len(out):,} documents from {len(counts):,} sources: "
        f"{os.path.getsize(corpus):,} bytes", file=sys.stderr)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("corpus", choices=sorted(BUILDERS))
  parser.add_argument("--cache", default=None,
                      help="Folder of downloaded packages (reused).")
  args = parser.parse_args(argv)
  cache = args.cache or os.path.join("/tmp", f"neardup_{args.corpus}_cache")
  os.makedirs(cache, exist_ok=True)
  build(args.corpus, cache)
  return 0


if __name__ == "__main__":
  sys.exit(main())
