"""Answer metrics of Graph Counselor: exact match, Rouge-L, BLEU, and the LLM-judge score.

All text metrics are pure functions (prediction, gold) -> score in [0, 1]:
- exact_match: SQuAD-style normalisation (lower case, no punctuation, no articles, single spaces);
  answers that are lists (comma / semicolon separated) match when their item multisets match,
  numbers match numerically ("3" == "3.0").
- rouge_l: the F-measure of the `rouge-score` package's Rouge-L (no stemming: the stemmer-free
  tokenizer needs no downloaded data).
- bleu: sentence BLEU-4 written here: clipped n-gram precisions, brevity penalty, add-one smoothing
  for n >= 2 (Lin & Och 2004), so short answers are scored sensibly; 0 when no unigram matches.
- llm_judge: a judge LLM reads question, reference and prediction and answers [Yes]/[No].
"""
from __future__ import annotations

import collections
import functools
import math
import re
import string
from typing import Sequence

from gp_jax.counselor.agents import loop as agents_lib
from gp_jax.counselor.agents import prompts
from gp_jax.counselor.agents import records
from gp_jax.llm import base

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_LIST_SPLIT = re.compile(r"\s*[,;]\s*|\s+and\s+")


def normalize_answer(text: str) -> str:
  text = str(text).lower().translate(_PUNCT)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def _as_number(text: str) -> float | None:
  try:
    return float(text.replace(",", "").strip())
  except ValueError:
    return None


def exact_match(prediction: str | None, gold: str) -> float:
  """1.0 when the normalised prediction equals the normalised gold answer (see module doc)."""
  if prediction is None:
    return 0.0
  pred, ref = str(prediction).strip(), str(gold).strip()
  a, b = _as_number(pred), _as_number(ref)
  if a is not None and b is not None:
    return float(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9))
  if normalize_answer(pred) == normalize_answer(ref):
    return 1.0
  pred_items = sorted(normalize_answer(x) for x in _LIST_SPLIT.split(pred) if x.strip())
  ref_items = sorted(normalize_answer(x) for x in _LIST_SPLIT.split(ref) if x.strip())
  return float(len(ref_items) > 1 and pred_items == ref_items)


@functools.lru_cache(maxsize=1)
def _rouge_scorer():
  from rouge_score import rouge_scorer  # imported lazily: only scoring needs it
  return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


def rouge_l(prediction: str | None, gold: str) -> float:
  """Rouge-L F-measure in [0, 1] (rouge-score package, no stemming)."""
  if not prediction:
    return 0.0
  return float(_rouge_scorer().score(str(gold), str(prediction))["rougeL"].fmeasure)


def _ngrams(tokens: Sequence[str], n: int) -> collections.Counter:
  return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def bleu(prediction: str | None, gold: str, max_n: int = 4) -> float:
  """Sentence BLEU with add-one smoothing of the n >= 2 precisions.

  BLEU = BP * exp(mean_n log p_n), p_1 = clipped matches / hypothesis unigrams,
  p_n = (clipped matches + 1) / (hypothesis n-grams + 1) for n >= 2,
  BP = 1 if c > r else exp(1 - r / c) (c, r: hypothesis and reference lengths).
  """
  if not prediction:
    return 0.0
  hyp = normalize_answer(prediction).split()
  ref = normalize_answer(gold).split()
  if not hyp or not ref:
    return 0.0
  log_p = 0.0
  for n in range(1, max_n + 1):
    h, r = _ngrams(hyp, n), _ngrams(ref, n)
    matches = sum(min(c, r[g]) for g, c in h.items())
    total = sum(h.values())
    if n == 1:
      if matches == 0:
        return 0.0
      p = matches / total
    else:
      p = (matches + 1) / (total + 1)
    log_p += math.log(p) / max_n
  bp = 1.0 if len(hyp) > len(ref) else math.exp(1 - len(ref) / len(hyp))
  return bp * math.exp(log_p)


async def llm_judge(pool: base.LLMPool, model: str, *, question: str, gold: str,
                    prediction: str | None, params: base.SamplingParams | None = None,
                    timeout_s: float = 600.0) -> tuple[float, records.CallRecord | None]:
  """The LLM-judge score (1.0 for [Yes]) and the judge call's record.

  An empty prediction scores 0 without a call; a failed call scores 0.
  """
  if not prediction:
    return 0.0, None
  msgs = prompts.metric_judge_messages(question=question, gold=gold, prediction=prediction)
  session = agents_lib.CallSession(
      pool=pool, select_llm=lambda step: model, qid="", question=question,
      sampling={"judge": params or base.SamplingParams(temperature=0.0, max_tokens=16)},
      call_timeout_s=timeout_s)
  c = await session.call("judge", 0, 0, msgs)
  score = float(agents_lib.parse_verdict(c.text)) if c.ok else 0.0
  return score, session.calls[0]


def text_scores(prediction: str | None, gold: str) -> dict[str, float]:
  """EM, Rouge-L and BLEU of one prediction."""
  return {"em": exact_match(prediction, gold), "rouge_l": rouge_l(prediction, gold),
          "bleu": bleu(prediction, gold)}
