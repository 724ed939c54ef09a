#!/usr/bin/env python3
"""Builds the bundled sample corpus in data/sample/ from license texts.

Usage: ``python bench/make_sample.py [--out data/sample]``

The texts are real prose that every Debian machine has offline: the license
texts in /usr/share/common-licenses/ and the LICENSE/COPYING files of the
Python packages installed next to the running interpreter. They are split into
paragraph-sized documents (40-400 words); short package license files (most
MIT, BSD and ISC licenses) stay whole, so files that differ only by copyright
holder and year are natural near-duplicates, as are the matching sections of
related licenses (GFDL-1.2/1.3, LGPL-2/2.1, GPL-2/LGPL-2). On top of that some
paragraphs get planted variants (changed year, a header line added, a few
words replaced, a truncated end, punctuation, case or line-wrapping changes)
and a few are copied exactly.

Output: part-000.jsonl and part-001.jsonl with one {"id", "text", "source"}
object per line; part-001.jsonl also holds three bad lines (malformed JSON, no
"text" field, a number as text) that the pipeline reports under rejected/.
Every choice is driven by a fixed seed and sorted file lists, so a second run
on the same machine writes byte-identical files. Which license files exist
differs between machines; the committed files are the reference.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import sysconfig
import textwrap
import zlib
from typing import List, NamedTuple, Optional

import numpy as np

SEED = 20240611
COMMON_LICENSES = "/usr/share/common-licenses"
MIN_WORDS, MAX_WORDS = 40, 400
# Share of the paragraph chunks of the long texts that goes into the sample.
# Chosen by a hash of the chunk's opening words rather than at random, so the
# matching sections of related licenses (GFDL-1.2/1.3, ...) are kept together.
KEEP_PERCENT_COMMON = 45
# Package files that bundle licenses (numpy, scipy, pillow, ...) draw from the
# buckets the common licenses leave out, so they add mostly unique text.
KEEP_PERCENT_PACKAGE = 25
MAX_CHUNKS_PER_PACKAGE_FILE = 10
# Per source document: chance of planted variants, and of an exact copy.
VARIANT_RATE = 0.12
COPY_RATE = 0.02
PACKAGE_PATTERNS = ("*.dist-info/LICENSE*", "*.dist-info/LICENCE*",
                    "*.dist-info/COPYING*", "*.dist-info/licenses/LICENSE*",
                    "*.dist-info/licenses/LICENCE*",
                    "*.dist-info/licenses/COPYING*")

HEADERS = (
    "Please read the following terms carefully.",
    "Reproduced from the project's LICENSE file.",
    "Excerpt, last reviewed 14 March 2021:",
    "== License terms ==",
    "NOTE: the following text is provided for reference only.",
    "Section copied from the upstream distribution.",
)
# Word swaps that keep the text readable (lowercase key -> replacement).
SWAPS = {
    "software": "program", "program": "software", "shall": "will",
    "must": "shall", "license": "licence", "licenses": "licences",
    "provided": "supplied", "including": "incl.", "without": "absent",
    "distribute": "redistribute", "permission": "consent",
    "notice": "statement", "work": "project", "terms": "conditions",
    "conditions": "terms", "following": "below", "version": "release",
    "modify": "change", "rights": "entitlements", "source": "original",
    "any": "every", "such": "said", "code": "source code", "you": "the user",
    "this": "the", "that": "which", "document": "text", "copies": "duplicates",
    "warranty": "guarantee", "holders": "owners", "authors": "writers",
    "free": "gratis", "public": "general", "use": "utilise",
}

# Lines the pipeline must reject, placed in part-001.jsonl.
BAD_LINES = (
    '{"id": "bad-malformed-json", "text": "this line was cut off',
    json.dumps({"id": "bad-missing-text", "body": "This record names its "
                "text field 'body', so the pipeline rejects it.",
                "source": "hand-written"}),
    json.dumps({"id": "bad-number-text", "text": 1234567890,
                "source": "hand-written"}),
)


class Doc(NamedTuple):
  id: str
  text: str
  source: str


def main(argv: Optional[List[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(
      os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
      "sample"), help="Output directory (default: data/sample/ of the repo).")
  args = parser.parse_args(argv)

  base = collect_documents()
  variants, copies = [], []
  for doc in base:
    rng = doc_rng(doc.id)
    if rng.random() < VARIANT_RATE:
      variants.extend(plant_variants(doc, rng))
    if rng.random() < COPY_RATE:
      copies.append(Doc(f"{doc.id}/copy", doc.text, doc.source))
  # Shuffled by a hash of the id, and split in two by another: a license file
  # more or less on some machine adds or drops only its own documents.
  parts = [[], []]
  for doc in sorted(base + variants + copies, key=lambda d: _hash(d.id, 1)):
    parts[_hash(doc.id, 2) % 2].append(_line(doc))
  for position, line in zip((7, len(parts[1]) // 2, len(parts[1]) - 5),
                            BAD_LINES):
    parts[1].insert(position, line)

  os.makedirs(args.out, exist_ok=True)
  for i, lines in enumerate(parts):
    path = os.path.join(args.out, f"part-{i:03d}.jsonl")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
      f.write("".join(line + "\n" for line in lines))
    print(f"wrote {path}: {len(lines)} lines, {os.path.getsize(path):,} bytes",
          file=sys.stderr)
  print(f"{len(base)} source documents, {len(variants)} planted variants, "
        f"{len(copies)} exact copies, {len(BAD_LINES)} bad lines",
        file=sys.stderr)
  return 0


def _line(doc: Doc) -> str:
  return json.dumps({"id": doc.id, "text": doc.text, "source": doc.source},
                    ensure_ascii=False)


# ---------------------------------------------------------------- sources


def source_files() -> List[tuple]:
  """(source name, path) of every license text, sorted, symlinks skipped."""
  files = []
  if os.path.isdir(COMMON_LICENSES):
    for name in sorted(os.listdir(COMMON_LICENSES)):
      path = os.path.join(COMMON_LICENSES, name)
      if os.path.isfile(path) and not os.path.islink(path):
        files.append((f"common-licenses/{name}", path))
  site = sysconfig.get_paths()["purelib"]
  paths = set()
  for pattern in PACKAGE_PATTERNS:
    paths.update(glob.glob(os.path.join(site, pattern)))
  for path in sorted(paths):
    if os.path.isfile(path):
      files.append((os.path.relpath(path, site).replace(os.sep, "/"), path))
  return files


def read_text(path: str) -> Optional[str]:
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError):
    return None
  text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\f", "")
  return text.strip("\n")


def collect_documents() -> List[Doc]:
  docs = []
  for source, path in source_files():
    text = read_text(path)
    if text is None:
      continue
    words = len(text.split())
    is_package = not source.startswith("common-licenses/")
    slug = _slug(source)
    if is_package and MIN_WORDS <= words <= MAX_WORDS:
      docs.append(Doc(slug, text.strip(), source))
      continue
    if words < MIN_WORDS:
      continue
    if is_package and text.lstrip().startswith("Apache License"):
      continue  # the stock Apache-2.0 text, already in common-licenses
    low, high = ((KEEP_PERCENT_COMMON, KEEP_PERCENT_COMMON +
                  KEEP_PERCENT_PACKAGE) if is_package
                 else (0, KEEP_PERCENT_COMMON))
    chosen = [(i, c) for i, c in enumerate(chunk(text))
              if low <= _bucket(c) < high]
    if is_package:
      chosen = chosen[:MAX_CHUNKS_PER_PACKAGE_FILE]
    docs.extend(Doc(f"{slug}/p{i:03d}", c, source) for i, c in chosen)
  return docs


def _slug(source: str) -> str:
  if source.startswith("common-licenses/"):
    return source.split("/", 1)[1]
  dist, _, rest = source.partition(".dist-info/")
  name = dist.split("-")[0]
  return f"{name}/{rest.replace('licenses/', '')}"


def _bucket(text: str) -> int:
  opening = " ".join(re.findall(r"\w+", text.lower())[:8])
  return zlib.crc32(opening.encode("utf-8")) % 100


def paragraphs(text: str) -> List[str]:
  return [p.strip("\n").rstrip() for p in re.split(r"\n[ \t]*\n", text)
          if p.strip()]


def chunk(text: str) -> List[str]:
  """Paragraphs merged or split into pieces of MIN_WORDS..MAX_WORDS words."""
  pieces = []
  for p in paragraphs(text):
    if len(p.split()) <= MAX_WORDS:
      pieces.append(p)
      continue
    lines, n = [], 0
    for line in p.split("\n"):  # an over-long paragraph: split at lines
      lines.append(line)
      n += len(line.split())
      if n >= MAX_WORDS // 2:
        pieces.append("\n".join(lines))
        lines, n = [], 0
    if lines:
      pieces.append("\n".join(lines))
  chunks, current, n = [], [], 0
  for piece in pieces:
    w = len(piece.split())
    if current and n + w > MAX_WORDS:
      chunks.append(current)
      current, n = [], 0
    current.append(piece)
    n += w
    if n >= MIN_WORDS:
      chunks.append(current)
      current, n = [], 0
  if current:  # a short tail joins the chunk before it when that fits
    if chunks and n + sum(len(p.split()) for p in chunks[-1]) <= MAX_WORDS:
      chunks[-1] = chunks[-1] + current
    else:
      chunks.append(current)
  texts = ["\n\n".join(c) for c in chunks]
  return [t for t in texts if MIN_WORDS <= len(t.split()) <= MAX_WORDS]


# --------------------------------------------------------------- variants


def change_year(text: str, rng) -> Optional[str]:
  years = sorted(set(re.findall(r"\b(?:19[89]\d|20[0-2]\d)\b", text)))
  if not years:
    return None
  old = years[int(rng.integers(len(years)))]
  new = str(int(old) + int(rng.choice([-3, -2, -1, 1, 2, 3])))
  return re.sub(rf"\b{old}\b", new, text, count=1)


def add_header(text: str, rng) -> str:
  return HEADERS[int(rng.integers(len(HEADERS)))] + "\n\n" + text


def replace_words(text: str, rng, k: int) -> Optional[str]:
  spans = [m for m in re.finditer(r"[A-Za-z]+", text)
           if m.group().lower() in SWAPS]
  if not spans:
    return None
  picks = sorted(rng.choice(len(spans), size=min(k, len(spans)),
                            replace=False))
  out, last = [], 0
  for i in picks:
    m = spans[i]
    word = m.group()
    new = SWAPS[word.lower()]
    if word.isupper() and len(word) > 1:
      new = new.upper()
    elif word[0].isupper():
      new = new[0].upper() + new[1:]
    out.extend([text[last:m.start()], new])
    last = m.end()
  out.append(text[last:])
  return "".join(out)


def truncate(text: str, rng) -> Optional[str]:
  """Drops the last sentence (a copy that was cut short)."""
  del rng
  ends = [m.end() for m in re.finditer(r"[.;:]\s", text)]
  if not ends:
    return None
  cut = text[:ends[-1]].rstrip()
  if len(cut.split()) < 0.85 * len(text.split()):
    return None
  return cut


def restyle(text: str, rng) -> str:
  """A change that normalisation undoes: re-wrapping, case or punctuation."""
  kind = int(rng.integers(4))
  if kind == 0:  # re-wrapped at another width
    width = int(rng.choice([60, 72, 100]))
    return "\n\n".join(textwrap.fill(" ".join(p.split()), width=width)
                       for p in paragraphs(text))
  if kind == 1:
    return text.upper()
  if kind == 2:  # typographic quotes and dashes, no semicolons
    text = re.sub(r'"([^"\n]*)"', "\u201c\\1\u201d", text)
    return (text.replace(" - ", " \u2014 ").replace(";", ",")
            .replace("(c)", "\u00a9"))
  return " ".join(text.split())  # one long line


def doc_rng(doc_id: str):
  """The random stream of one source document: fixed by SEED and its id."""
  return np.random.default_rng([SEED, _hash(doc_id, 0)])


def _hash(doc_id: str, stream: int) -> int:
  return zlib.crc32(f"{SEED}:{stream}:{doc_id}".encode("utf-8"))


def plant_variants(doc: Doc, rng) -> List[Doc]:
  """One to three edited copies of ``doc``, ids ``<id>/v1``, ``/v2``, ..."""
  out, made = [], set()
  for _ in range(int(rng.choice([1, 1, 1, 2, 2, 3]))):
    text = _mutate(doc.text, rng)
    if text != doc.text and text not in made:
      made.add(text)
      out.append(Doc(f"{doc.id}/v{len(made)}", text, doc.source))
  return out


def _mutate(text: str, rng) -> str:
  words = len(text.split())
  light = max(1, words // 80)
  steps = {
      "year": lambda t: change_year(t, rng),
      "header": lambda t: add_header(t, rng),
      "words": lambda t: replace_words(t, rng, light),
      "more_words": lambda t: replace_words(t, rng, 2 * light + 1),
      "truncate": lambda t: truncate(t, rng),
      "restyle": lambda t: restyle(t, rng),
  }
  names = sorted(steps)
  plan = [names[int(rng.integers(len(names)))]]
  if rng.random() < 0.4:
    plan.append(names[int(rng.integers(len(names)))])
  for name in plan:
    changed = steps[name](text)
    if changed is None:  # e.g. no year to change: restyle instead
      changed = steps["restyle"](text)
    text = changed
  return text



if __name__ == "__main__":
  sys.exit(main())
