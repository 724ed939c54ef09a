"""The template-family corpus: every paragraph of this machine's licence and
copyright files.

Debian packages' ``/usr/share/doc/*/copyright`` files and Python packages'
licence files repeat the same few licence texts with small changes (names,
years, versions, "or any later version"), so their paragraphs form many
template families, from verbatim copies to loose variants, with buckets of
every size. Built at run time from the files the machine has; never
committed.
"""

from __future__ import annotations

import glob
import os
import re
from typing import List, Tuple

from tests.corpus import _make_sample

MIN_WORDS = 20


def template_family_corpus(max_copies: int = 0) -> Tuple[List[str], List[str]]:
  """``(ids, texts)``: every paragraph (blank-line separated) of at least
  ``MIN_WORDS`` words of the licence files bench/make_sample.py reads and of
  ``/usr/share/doc/*/copyright``, in path order; ``max_copies`` > 0 keeps at
  most that many copies of one exact text. Deterministic for a given set of
  files."""
  sample = _make_sample()
  copyrights = sorted(p for p in glob.glob("/usr/share/doc/*/copyright")
                      if os.path.isfile(p) and not os.path.islink(p))
  sources = sample.source_files() + [(p[len("/usr/share/doc/"):], p)
                                     for p in copyrights]
  ids, texts, copies = [], [], {}
  for source, path in sources:
    text = sample.read_text(path)
    if text is None:
      continue
    for i, paragraph in enumerate(re.split(r"\n\s*\n", text)):
      paragraph = paragraph.strip()
      if len(paragraph.split()) < MIN_WORDS:
        continue
      copies[paragraph] = copies.get(paragraph, 0) + 1
      if max_copies and copies[paragraph] > max_copies:
        continue
      ids.append(f"{source}#{i:03d}")
      texts.append(paragraph)
  return ids, texts
