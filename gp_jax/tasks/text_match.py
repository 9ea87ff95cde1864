"""Text-overlap metrics: cover-exact-match (NaturalQuestions, TriviaQA) and CommonGen coverage.

CEM: a prediction is right when one gold alias, normalised (lower case, punctuation and the
articles a/an/the removed, whitespace collapsed), occurs in the normalised prediction as a whole
run of tokens. Token-level containment keeps "1995" from matching "19956"; an alias that
normalises to nothing (e.g. the gold "A", an article) never matches -- the authors' scorer let it
match every prediction.

Coverage: the fraction of concepts that appear in the generated text, comparing lemmas (the
dictionary-based lemmatiser `lemminflect`, which works offline), so "dogs" covers "dog" and "ran"
covers "run".
"""
from __future__ import annotations

import functools
import re
import string
import unicodedata

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation) | {"\u2018", "\u2019", "\u201c", "\u201d", "\u2013", "\u2014"}


def normalize_text(s: str) -> str:
  """SQuAD-style normalisation: lower case, no punctuation, no articles, single spaces."""
  s = unicodedata.normalize("NFKC", str(s)).lower()
  s = "".join(" " if ch in _PUNCT else ch for ch in s)
  s = _ARTICLES.sub(" ", s)
  return " ".join(s.split())


def _contains_run(hay: list[str], needle: list[str]) -> bool:
  n = len(needle)
  return any(hay[i:i + n] == needle for i in range(len(hay) - n + 1))


def cover_exact_match(prediction: str, aliases) -> float:
  """1.0 when any normalised gold alias is a contiguous token run of the normalised prediction.

  Args:
    prediction: the model's reply.
    aliases: gold answers (strings); empty ones are ignored.

  Returns:
    1.0 or 0.0.
  """
  pred = normalize_text(prediction).split()
  for alias in aliases:
    gold = normalize_text(alias).split()
    if gold and _contains_run(pred, gold):
      return 1.0
  return 0.0


@functools.lru_cache(maxsize=1)
def _lemminflect():
  import lemminflect
  return lemminflect


@functools.lru_cache(maxsize=50_000)
def lemmas(word: str) -> frozenset[str]:
  """The word itself plus every lemma it can have (any part of speech), lower case."""
  word = word.lower()
  lem = _lemminflect()
  out = {word}
  for forms in lem.getAllLemmas(word).values():
    out.update(f.lower() for f in forms)
  if len(out) == 1 and word.isalpha():
    # Unknown to the dictionary: fall back to the package's rules for nouns and verbs.
    for upos in ("NOUN", "VERB"):
      for forms in lem.getAllLemmasOOV(word, upos).values():
        out.update(f.lower() for f in forms)
  return frozenset(out)


def _words(text: str) -> list[str]:
  return re.findall(r"[a-z]+(?:'[a-z]+)?", unicodedata.normalize("NFKC", text).lower())


def split_concepts(concepts) -> list[str]:
  """Concept list from "a, b, c" (the LLMRouter ground truth) or a list."""
  if isinstance(concepts, str):
    items = re.split(r"[,\n;]", concepts)
  else:
    items = list(concepts)
  return [c.strip().lower() for c in items if str(c).strip()]


def concept_coverage(prediction: str, concepts) -> float:
  """Fraction of concepts used in the prediction, after lemmatising both sides.

  A multi-word concept counts when each of its words is covered. Duplicate concepts count once.

  Args:
    prediction: generated text.
    concepts: "a, b, c" or a list of concept strings.

  Returns:
    A float in [0, 1] (0.0 when there are no concepts).
  """
  wanted = list(dict.fromkeys(split_concepts(concepts)))
  if not wanted:
    return 0.0
  seen: set[str] = set()
  for w in _words(prediction):
    seen |= lemmas(w)
  hit = 0
  for concept in wanted:
    parts = _words(concept)
    if parts and all(lemmas(p) & seen for p in parts):
      hit += 1
  return hit / len(wanted)
