"""Benchmark corpora with planted near-duplicates, deterministic from a seed.

* :func:`seed_style`: the method's seed experiment at any size: documents of
  50 tokens drawn uniformly from a small vocabulary; a fraction of them is
  followed by a copy with 10% of its tokens replaced.
* :func:`web_like`: word-like tokens with Zipf frequencies, log-normal lengths
  (median ~400 words, capped at 5,000), sentences with capitalisation and
  punctuation; a fraction of documents gets 1-3 copies with a few percent of
  words replaced and a short header line added. Documents are shuffled.

Both return a :class:`Corpus` whose ``groups`` list the planted duplicate
groups (original plus copies, as indices into ``texts``).
"""

from __future__ import annotations

import json
import os
from typing import List, NamedTuple

import numpy as np


class Corpus(NamedTuple):
  name: str
  texts: List[str]
  groups: List[List[int]]


def seed_style(n_docs: int, *, vocab: int = 3000, length: int = 50,
               dup_rate: float = 0.3, edit_frac: float = 0.10,
               seed: int = 0) -> Corpus:
  """Exactly ``n_docs`` documents; each original is followed by its copy
  (with probability ``dup_rate``), as in the method's experiment."""
  rng = np.random.default_rng([seed, 1])
  n_base = int(n_docs / (1 + dup_rate)) + 64
  while True:
    has_copy = rng.random(n_base) < dup_rate
    if n_base + has_copy.sum() >= n_docs:
      break
    n_base *= 2
  base = rng.integers(vocab, size=(n_base, length))
  copies = base[has_copy].copy()
  n_edits = int(length * edit_frac)
  # n_edits distinct positions per copy: the first columns of a random order.
  positions = np.argsort(rng.random((len(copies), length)), axis=1)[:, :n_edits]
  np.put_along_axis(copies, positions,
                    rng.integers(vocab, size=(len(copies), n_edits)), axis=1)
  # Interleave: original i, then its copy when it has one.
  slots = 1 + has_copy.astype(np.int64)
  start = np.zeros(n_base, dtype=np.int64)
  np.cumsum(slots[:-1], out=start[1:])
  tokens = np.empty((n_base + len(copies), length), dtype=np.int64)
  tokens[start] = base
  tokens[start[has_copy] + 1] = copies
  tokens = tokens[:n_docs]
  words = [f"w{t}" for t in range(vocab)]
  texts = [" ".join([words[t] for t in row]) for row in tokens.tolist()]
  orig = start[has_copy]
  groups = [[int(i), int(i) + 1] for i in orig if i + 1 < n_docs]
  return Corpus("seed-style", texts, groups)


# Function words at the top of the Zipf ranking make texts look like prose and
# give the frequency head real English tokens.
_FUNCTION_WORDS = (
    "the of and to a in is that for it as was with be by on not he this are"
    " or his from at which but have an they you were her she there been one"
    " all we their has would when if so no will more can who its than other"
    " into some could them these about then only also may after new first"
    " two over such most our people time year any very").split()
_ONSETS = ("b c d f g h j k l m n p r s t v w z br cr dr fr gr pr tr bl cl fl"
           " gl pl sl sh ch th st sp sc sk sm sn str").split()
_VOWELS = "a e i o u a e i o ea ou ai io".split()
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "rt",
          "ck", "x")
_HEADERS = (
    "Posted by {w} on {d}", "Home > {W} > {W} {W}", "Updated {d} | {W} News",
    "Share this article: {W} {W}", "From Wikipedia, the free encyclopedia",
    "Skip to content. {W} {W} menu", "Copyright {y} {W} {W}. All rights"
    " reserved.")


def _word_like_vocabulary(size: int, rng) -> List[str]:
  syllables = [o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS]
  words, seen = list(_FUNCTION_WORDS), set(_FUNCTION_WORDS)
  while len(words) < size:
    batch = 2 * (size - len(words))
    n_syl = rng.choice([1, 2, 2, 3, 3, 4], size=batch).tolist()
    picks = rng.integers(len(syllables), size=(batch, 4)).tolist()
    for k, row in zip(n_syl, picks):
      word = "".join([syllables[i] for i in row[:k]])
      if word not in seen and len(words) < size:
        seen.add(word)
        words.append(word)
  # Shorter words are more frequent in real text: rank by length after the
  # function words (stable, so the order is still seeded).
  head = len(_FUNCTION_WORDS)
  return words[:head] + sorted(words[head:], key=len)


def web_like(n_docs: int, *, vocab: int = 50_000, zipf_s: float = 1.07,
             median_words: int = 400, sigma: float = 0.9,
             max_words: int = 5000, min_words: int = 20,
             dup_rate: float = 0.2, edit_range=(0.01, 0.04),
             seed: int = 0) -> Corpus:
  """Exactly ``n_docs`` web-like documents in shuffled order; ``groups`` holds
  each original with its near-duplicate copies."""
  rng = np.random.default_rng([seed, 2])
  words = _word_like_vocabulary(vocab, rng)
  weights = 1.0 / (np.arange(vocab) + 2.7) ** zipf_s
  cdf = np.cumsum(weights / weights.sum())

  def draw(k):
    return np.minimum(np.searchsorted(cdf, rng.random(k)), vocab - 1)

  def render_words(tokens):
    """Words with a few numbers and capitalised names mixed in."""
    u = rng.random(len(tokens))
    numbers = rng.integers(1, 2030, size=len(tokens)).tolist()
    out = []
    for t, x, num in zip(tokens.tolist(), u.tolist(), numbers):
      out.append(str(num) if x < 0.01 else
                 words[t].capitalize() if x < 0.04 else words[t])
    return out

  def render(tokens):
    """Rendered words with punctuation and paragraph breaks attached."""
    out = render_words(tokens)
    n = len(out)
    commas = np.flatnonzero(rng.random(n) < 0.07).tolist()
    for j in commas:
      out[j] += ","
    i = 0
    while i < n:
      end = min(n, i + int(rng.integers(6, 29)))
      out[i] = out[i].capitalize()
      out[end - 1] = (out[end - 1].rstrip(",") + ".....?!"[int(rng.integers(7))]
                      + ("\n\n" if rng.random() < 0.2 else ""))
      i = end
    return out

  def header():
    template = _HEADERS[int(rng.integers(len(_HEADERS)))]
    return template.format(
        w=words[int(draw(1)[0])], W=words[int(draw(1)[0])].capitalize(),
        d=f"{int(rng.integers(2005, 2026))}-{int(rng.integers(1, 13)):02d}-"
          f"{int(rng.integers(1, 29)):02d}",
        y=int(rng.integers(2005, 2026))).split(" ")

  def join(rendered):
    return " ".join(rendered).replace("\n\n ", "\n\n").strip()

  texts, groups = [], []
  while len(texts) < n_docs:
    length = int(np.clip(
        round(median_words * np.exp(sigma * rng.standard_normal())),
        min_words, max_words))
    rendered = render(draw(length))
    group = [len(texts)]
    texts.append(join(rendered))
    if rng.random() < dup_rate:
      for _ in range(int(rng.choice([1, 1, 1, 1, 1, 1, 1, 2, 2, 3]))):
        if len(texts) >= n_docs:
          break
        copy = list(rendered)
        frac = rng.uniform(*edit_range)
        n_edit = max(1, int(round(frac * len(copy))))
        positions = rng.choice(len(copy), size=min(n_edit, len(copy)),
                               replace=False)
        for pos, new in zip(positions.tolist(),
                            render_words(draw(len(positions)))):
          # Keep the punctuation and line breaks around the replaced word.
          old = copy[pos]
          core = old.rstrip(",.?!\n")
          copy[pos] = new + old[len(core):]
        group.append(len(texts))
        texts.append(join(header() + ["\n\n"] + copy))
    if len(group) > 1:
      groups.append(group)
  order = rng.permutation(n_docs)
  new_index = np.empty(n_docs, dtype=np.int64)
  new_index[order] = np.arange(n_docs)
  texts = [texts[i] for i in order.tolist()]
  groups = [sorted(int(new_index[i]) for i in g) for g in groups]
  return Corpus("web-like", texts, sorted(groups))


def write(corpus: Corpus, directory: str) -> str:
  """Writes ``corpus.jsonl`` (one ``{"id", "text"}`` per line) and
  ``truth.json`` (the groups) to ``directory``; returns the JSONL path."""
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "corpus.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    for i, text in enumerate(corpus.texts):
      f.write(json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n")
  with open(os.path.join(directory, "truth.json"), "w", encoding="utf-8") as f:
    json.dump({"name": corpus.name, "groups": corpus.groups}, f)
  return path


def read(directory: str) -> Corpus:
  with open(os.path.join(directory, "corpus.jsonl"), encoding="utf-8") as f:
    texts = [json.loads(line)["text"] for line in f]
  with open(os.path.join(directory, "truth.json"), encoding="utf-8") as f:
    truth = json.load(f)
  return Corpus(truth["name"], texts, truth["groups"])
