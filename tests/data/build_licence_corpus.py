#!/usr/bin/env python3
"""Freezes tests/corpus.py's real-text corpus into tests/data/.

Usage: ``python tests/data/build_licence_corpus.py`` (run once; the committed
files are the reference, because which licence files a machine has differs).

Writes ``licence_corpus.jsonl.xz`` (one ``{"id", "text", "source"}`` object
per document, in corpus order) and ``licence_corpus_manifest.tsv``: per
source file its package and version (dpkg for /usr/share files, the
dist-info METADATA for Python packages), path, licence (the DEP-5
``License:`` names of a Debian copyright file, the licence expression or
classifier of a Python package, the file name of a common licence), the
number of documents taken from it and the file's SHA-256.
"""

from __future__ import annotations

import csv
import email.parser
import hashlib
import json
import lzma
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
sys.path.insert(0, ROOT)

# pylint: disable=wrong-import-position
from tests.corpus import (LICENCE_CORPUS, LICENCE_MANIFEST,  # noqa: E402
                          real_text_documents)

COLUMNS = ("source", "package", "version", "path", "licence", "documents",
           "sha256")
MAX_LICENCE_NAMES = 12


def _dpkg_owner(path):
  """(package, version) that installed ``path``: dpkg's owner, else the
  /usr/share/doc/<package>/ folder's name (Debian policy)."""
  found = subprocess.run(["dpkg", "-S", path], capture_output=True,
                         text=True, check=False)
  if found.returncode:
    package = os.path.basename(os.path.dirname(path))
  else:
    package = found.stdout.split(":", 1)[0].split(",")[0].strip()
  version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package],
                           capture_output=True, text=True, check=False)
  return package, version.stdout.strip()


def _dep5_licences(text):
  names = []
  for match in re.finditer(r"^License:[ \t]*(\S[^\n]*)", text, re.M):
    name = match.group(1).strip()
    if name not in names:
      names.append(name)
  if not names:
    names = sorted(set(re.findall(r"/usr/share/common-licenses/([\w.+-]+\w)",
                                  text)))
    return "; ".join(names) or "not machine-readable (see the file)"
  more = len(names) - MAX_LICENCE_NAMES
  return "; ".join(names[:MAX_LICENCE_NAMES]) + (f"; … {more} more"
                                                 if more > 0 else "")


def _python_package(path):
  """(name, version, licence) from the dist-info folder holding ``path``."""
  folder = path
  while not folder.endswith(".dist-info"):
    folder = os.path.dirname(folder)
  with open(os.path.join(folder, "METADATA"), encoding="utf-8") as f:
    meta = email.parser.Parser().parse(f, headersonly=True)
  licence = meta.get("License-Expression") or ""
  if not licence:
    classifiers = [c.split("::")[-1].strip()
                   for c in meta.get_all("Classifier", [])
                   if c.startswith("License ::")]
    short = (meta.get("License") or "").strip()
    licence = "; ".join(classifiers) or (short if 0 < len(short) <= 80
                                         else "see the file")
  return meta["Name"], meta["Version"], licence


def describe(source, path):
  if "/site-packages/" in path or "/dist-packages/" in path:
    return _python_package(path)
  package, version = _dpkg_owner(path)
  if source.startswith("common-licenses/"):
    return package, version, os.path.basename(path)
  with open(path, encoding="utf-8") as f:
    return package, version, _dep5_licences(f.read())


def main() -> int:
  docs = real_text_documents()
  counts, paths = {}, {}
  for _, _, source, path in docs:
    counts[source] = counts.get(source, 0) + 1
    paths[source] = path
  with lzma.open(LICENCE_CORPUS, "wt", encoding="utf-8", preset=9) as f:
    for doc_id, text, source, _ in docs:
      f.write(json.dumps({"id": doc_id, "text": text, "source": source},
                         ensure_ascii=False) + "\n")
  with open(LICENCE_MANIFEST, "w", encoding="utf-8", newline="") as f:
    out = csv.writer(f, delimiter="\t", lineterminator="\n")
    out.writerow(COLUMNS)
    for source in sorted(counts):
      path = paths[source]
      with open(path, "rb") as g:
        digest = hashlib.sha256(g.read()).hexdigest()
      package, version, licence = describe(source, path)
      out.writerow([source, package, version, path, licence, counts[source],
                    digest])
  print(f"{len(docs):,} documents from {len(counts):,} files: "
        f"{os.path.getsize(LICENCE_CORPUS):,} bytes", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
