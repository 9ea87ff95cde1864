"""Exact match, Rouge-L, BLEU (against hand-computed values) and the LLM-judge score."""
import math

import pytest

from gp_jax.counselor.eval import metrics
from tests.counselor.conftest import MODEL, ScriptedPool, run


@pytest.mark.parametrize("pred, gold, em", [
    ("The Eiffel Tower.", "eiffel tower", 1.0),
    ("3", "3.0", 1.0),
    ("1,000", "1000", 1.0),
    ("412.35", "412.350", 1.0),
    ("Bob, Alice", "Alice, Bob", 1.0),
    ("Alice and Bob", "Bob, Alice", 1.0),
    ("Alice", "Alice, Bob", 0.0),
    ("Alice, Bob, Carol", "Alice, Bob", 0.0),
    ("2019", "2018", 0.0),
    ("Ann Lee", "Ann Leeds", 0.0),
    ("", "x", 0.0),
    (None, "x", 0.0),
])
def test_exact_match(pred, gold, em):
  assert metrics.exact_match(pred, gold) == em


def test_rouge_l_values():
  assert metrics.rouge_l("alice bob", "alice carol bob") == pytest.approx(0.8)
  assert metrics.rouge_l("Graph Agents", "graph agents") == pytest.approx(1.0)
  assert metrics.rouge_l("x y z", "a b c") == 0.0
  assert metrics.rouge_l(None, "a") == 0.0 and metrics.rouge_l("", "a") == 0.0


def test_bleu_hand_computed():
  assert metrics.bleu("2019", "2019") == pytest.approx(1.0)
  # p1 = 2/3, p2 = (1+1)/(2+1), p3 = (0+1)/(1+1), p4 = (0+1)/(0+1); BP = 1
  assert metrics.bleu("alice bob carol", "alice bob dave") == pytest.approx((2 / 9) ** 0.25)
  # all precisions 1, BP = exp(1 - 2/1)
  assert metrics.bleu("alice", "alice bob") == pytest.approx(math.exp(-1))
  assert metrics.bleu("carol", "alice bob") == 0.0
  assert metrics.bleu(None, "a") == 0.0 and metrics.bleu("...", "a") == 0.0
  long_ref = "a b c d e f g h"
  assert metrics.bleu(long_ref, long_ref) == pytest.approx(1.0)
  assert 0.0 < metrics.bleu("a b c d x f g h", long_ref) < 1.0


def test_text_scores_bundle():
  s = metrics.text_scores("Ann Lee", "Ann Lee")
  assert s == {"em": 1.0, "rouge_l": pytest.approx(1.0), "bleu": pytest.approx(1.0)}


def test_llm_judge():
  pool = ScriptedPool(lambda kind, user, i: "[Yes]" if "Predicted answer: Paris" in user else "[No]")
  score, call = run(metrics.llm_judge(pool, MODEL, question="Capital of France?", gold="Paris",
                                      prediction="Paris"))
  assert score == 1.0 and call.kind == "judge" and call.model == MODEL and call.cost_usd > 0
  assert pool.seen[0].kind == "metric_judge"
  assert "Reference answer: Paris" in pool.seen[0].messages[-1]["content"]
  score, _ = run(metrics.llm_judge(pool, MODEL, question="Capital of France?", gold="Paris",
                                   prediction="Lyon"))
  assert score == 0.0
  n = len(pool.seen)
  score, call = run(metrics.llm_judge(pool, MODEL, question="q", gold="g", prediction=None))
  assert score == 0.0 and call is None and len(pool.seen) == n  # no call for an empty answer
  failing = ScriptedPool(lambda *a: None)
  score, call = run(metrics.llm_judge(failing, MODEL, question="q", gold="g", prediction="p"))
  assert score == 0.0 and call.error == "scripted_failure"
