"""Tables of right answers in many formats (score 1) and near misses (score 0), per metric."""
from __future__ import annotations

import time

import pytest

from gp_jax import errors
from gp_jax import types
from gp_jax.tasks import extract
from gp_jax.tasks import metrics

# (gold, prediction, expected) -- GSM8K / MGSM.
NUMERIC = [
    ("#### 18", "The answer is 18", 1),
    ("18", "18.0", 1),  # the authors' scorer read this as 180
    ("18", "18.00", 1),
    ("18", "$18", 1),
    ("18", "She makes 18 dollars every day.", 1),
    ("18", "**Answer:** 18", 1),
    ("18", "so the total is \\boxed{18}.", 1),
    ("18", "6 * 3 = 18", 1),
    ("18", "Step 1: 16 - 3 - 4 = 9. Step 2: 9 * 2 = 18.\nAnswer: 18", 1),
    ("18", "The answer is 18. (Check: 9 eggs x $2 = 18.)", 1),
    ("#### 20,000", "Blake gave Connie $20,000.", 1),
    ("20000", "20,000", 1),
    ("20000", "$20,000.00", 1),
    ("-5", "The temperature is -5 degrees.", 1),
    ("-5", "\u22125", 1),  # unicode minus sign
    ("0.5", "1/2", 1),
    ("3/4", "0.75", 1),
    ("1/2", "\\frac{1}{2}", 1),
    ("25", "25%", 1),
    ("#### 1,234.5", "#### 1234.50", 1),
    ("18", "180", 0),
    ("18", "1.8", 0),
    ("18", "18.5", 0),
    ("18", "-18", 0),
    ("20000", "20", 0),
    ("18", "I first thought 18, but the final answer: 19", 0),
    ("18", "I cannot solve this.", 0),
    ("18", "", 0),
    ("5", "5 apples and 6 pears", 0),  # the last number is what counts
    ("2", "H2O", 0),  # digits inside words are not numbers
    ("123", "1,2,3", 0),
    ("3/4", "34", 0),
]


@pytest.mark.parametrize("gold,pred,want", NUMERIC)
def test_numeric(gold, pred, want):
  assert metrics.numeric_score(pred, gold) == want


# (gold solution or answer, prediction, expected) -- MATH / AIME.
MATH = [
    ("so the sum is \\boxed{\\frac{1}{2}}.", "\\boxed{0.5}", 1),
    ("\\boxed{\\frac12}", "The answer is $\\boxed{\\dfrac{1}{2}}$", 1),
    ("\\boxed{\\sqrt{8}}", "\\boxed{2\\sqrt{2}}", 1),
    ("\\boxed{\\frac{\\sqrt3}{2}}", "\\boxed{\\frac{\\sqrt{3}}{2}}", 1),
    ("\\boxed{y=-2x+1}", "\\boxed{y = 1 - 2x}", 1),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\boxed{(3,\\frac{\\pi}{2})}", 1),
    ("\\boxed{(-\\infty,5)\\cup (5,\\infty)}", "\\boxed{(-\\infty, 5) \\cup (5, \\infty)}", 1),
    ("\\boxed{10}", "\\boxed{10\\%}", 1),
    ("\\boxed{5^\\circ}", "\\boxed{5}", 1),
    ("\\boxed{18.90}", "\\boxed{\\$18.9}", 1),
    ("\\boxed{10}", "\\boxed{10 \\text{ cm}}", 1),
    ("\\boxed{2}", "\\boxed{x=2}", 1),
    ("\\boxed{\\text{Monday}}", "\\boxed{\\text{Monday}}", 1),
    ("\\boxed{x^2+2x+1}", "\\boxed{(x+1)^2}", 1),
    ("\\boxed{1,000}", "\\boxed{1000}", 1),
    ("\\boxed{-3, 2}", "\\boxed{2, -3}", 1),  # a bare list of solutions is unordered
    ("\\{1,2\\}", "\\boxed{\\{2,1\\}}", 1),  # a LaTeX set is unordered
    ("\\boxed{\\{-1, \\frac{1}{2}\\}}", "\\boxed{\\left\\{\\frac12,-1\\right\\}}", 1),
    ("\\{1,2\\}", "\\boxed{2, 1}", 1),  # ...and equals a bare list of its elements
    ("70", "\\boxed{070}", 1),  # AIME answers are written with leading zeros
    ("70", "The final answer is 70.", 1),  # stated without \boxed
    ("\\boxed{4}", "First \\boxed{3}... wait, actually \\boxed{4}", 1),  # the last box counts
    ("\\boxed{\\frac{1}{3}}", "\\boxed{0.33}", 0),
    ("0.33", "\\boxed{\\frac{1}{3}}", 0),
    ("\\boxed{2\\sqrt{2}}", "\\boxed{2\\sqrt{3}}", 0),
    ("\\boxed{(1,2)}", "\\boxed{(2,1)}", 0),
    ("\\{1,2\\}", "\\boxed{\\{1,3\\}}", 0),
    ("\\{1,2\\}", "\\boxed{\\{1,2,2\\}}", 0),
    ("\\{1,2\\}", "\\boxed{(2,1)}", 0),  # a tuple is not a set
    ("\\boxed{(0,1)}", "\\boxed{[0,1)}", 0),
    ("\\boxed{5}", "\\boxed{-5}", 0),
    ("\\boxed{x^2}", "\\boxed{x^3}", 0),
    ("\\boxed{y=-2x+1}", "\\boxed{y=2x+1}", 0),
    ("\\boxed{4}", "First \\boxed{4}... wait, actually \\boxed{3}", 0),
    ("\\boxed{70}", "\\boxed{71}", 0),
    ("\\boxed{1}", "\\boxed{}", 0),
    ("\\boxed{1}", "\\boxed{9^{9^{9^{9}}}}", 0),  # must neither hang nor match
    ("\\boxed{1}", "\\boxed{10^{100000}}", 0),
    ("\\boxed{0}", "\\boxed{__import__('os').system('true')}", 0),  # never evaluated
    ("\\boxed{3}", "Let me think about this problem step by step. There are many cases to "
                   "consider and I am not sure.", 0),
]


@pytest.mark.parametrize("gold,pred,want", MATH)
def test_math(gold, pred, want):
  t = time.perf_counter()
  assert metrics.math_score(pred, gold) == want
  assert time.perf_counter() - t < 5.0


LABELS = ["A", "B", "C", "D", "E"]
TEXTS = ["bus depot", "train station", "beach", "bridge", "taxi"]
# (prediction, expected for gold "B")
CHOICE = [
    ("B", 1), ("b", 1), ("(B)", 1), ("B)", 1), ("B.", 1), ("Answer: B", 1), ("answer:B", 1),
    ("the answer is b", 1), ("The answer is (b).", 1), ("**Answer:** B", 1), ("Answer: $B$", 1),
    ("\\boxed{B}", 1), ("\\boxed{\\text{(B)}}", 1), ("Final answer: B", 1), ("I choose B", 1),
    ("answer: B) train station", 1), ("Option B", 1), ("The answer is: train station", 1),
    ("The answer is a train station.", 1), ("The best option is (B)", 1),
    ("The correct answer is B because trains are free.", 1),
    ("A is tempting and C is close. The correct answer is B.", 1),
    ("Let me look at each option.\nA) bus depot: no\nC) beach: no\n\nAnswer: B", 1),
    ("Hmm.\n(B)\n", 1),
    # the marked label followed by that option's own text
    ("(B) train station.", 1), ("B. train station", 1), ("B) Train Station", 1),
    ("B: train station", 1), ("Thinking it over.\n(B) train station", 1),
    ("(A) bus depot.", 0), ("B. bus depot", 0),
    ("(A) bus depot\n(B) train station\n(C) beach", 0),  # the options restated: no choice
    ("A", 0), ("Answer: C", 0), ("The answer is a bus depot", 0),
    ("Bus depots and beaches are both wrong", 0),  # B inside words is not a choice
    ("Because of the bridge, the taxi is best.", 0),
    ("Both are possible.", 0), ("", 0), ("Answer: F", 0), ("I don't know", 0),
    ("The answer is B... no wait, the answer is D.", 0),  # the last statement counts
]


@pytest.mark.parametrize("pred,want", CHOICE)
def test_choice(pred, want):
  assert metrics.choice_score(pred, LABELS, "B", TEXTS) == want


def test_choice_keeps_the_article_rule():
  # An unmarked capital "A" followed by words is an article, never option A, even with texts.
  assert extract.extract_choice("A because the depot is closer.", LABELS, TEXTS) is None
  assert extract.extract_choice("A bus depot is where buses rest.", LABELS, TEXTS) is None
  assert metrics.choice_score("The answer is A because buses wait there.", LABELS, "A",
                              TEXTS) == 0


def test_choice_respects_row_option_count():
  # "e" is a label of a five-option row but not of a four-option row.
  assert metrics.choice_score("the answer is e", LABELS, "E") == 1
  assert metrics.choice_score("the answer is e", LABELS[:4], "D") == 0
  assert extract.extract_choice("the answer is e", LABELS[:4]) is None


def test_choice_with_digit_labels():
  labels, texts = ["1", "2", "3", "4"], ["rock", "water", "air", "space"]
  assert metrics.choice_score("Answer: 2", labels, "2", texts) == 1
  assert metrics.choice_score("(3)", labels, "2", texts) == 0


def test_letter_gold_never_matches_by_substring():
  # The authors' CEM scorer stripped "A" as an article, so every reply matched gold "A".
  for pred in ("I don't know", "A bus depot is a place.", "Apples are red", "Answer: C"):
    assert metrics.choice_score(pred, LABELS, "A", TEXTS) == 0


LOGIC_LABELS, LOGIC_TEXTS = ["A", "B", "C", "D"], ["1", "2", "3", "4"]
LOGIC = [
    ("Answer: 4", 1), ("Answer: D", 1), ("The answer is house 4.", 1), ("\\boxed{4}", 1),
    ("4", 1), ("So the person lives in house 4.\nAnswer: house 4", 1),
    ("Answer: 3", 0), ("Answer: C", 0), ("There are 4 houses. Answer: 2", 0),
    ("4 houses in total", 0), ("", 0),
]


@pytest.mark.parametrize("pred,want", LOGIC)
def test_logic_grid(pred, want):
  assert metrics.logic_grid_score(pred, LOGIC_LABELS, "D", LOGIC_TEXTS) == want


# (gold aliases, prediction, expected) -- NaturalQuestions / TriviaQA cover-EM.
CEM = [
    (["Sammy Davis, Jr"], "It was Sammy Davis Jr.", 1),
    (["Ben Gibbard"], "ben gibbard wrote it", 1),
    (["the Tremeloes"], "Tremeloes", 1),
    (["bayreuth germany", "Bayreuth"], "Bayreuth.", 1),
    (["1995"], "In 1995.", 1),
    (["Kim Jong-un"], "Kim Jong un", 1),
    (["1995"], "19956", 0),
    (["1995"], "1996", 0),
    (["Ben Gibbard"], "Ben", 0),
    (["Paris"], "Parisian", 0),
    (["A"], "A bus depot", 0),  # an alias that is only an article matches nothing
    (["the"], "the answer", 0),
    (["Sammy Davis, Jr"], "", 0),
]


@pytest.mark.parametrize("aliases,pred,want", CEM)
def test_cem(aliases, pred, want):
  assert metrics.cem_score(pred, aliases) == want


# (concepts, prediction, expected) -- CommonGen coverage.
COVERAGE = [
    ("dog, run, ball", "The dogs ran after the ball.", 1.0),
    ("child, eat, apple", "Children ate apples.", 1.0),
    ("leaf, fall, tree", "Leaves fell from the trees.", 1.0),
    ("goose, swim, lake", "Two geese were swimming in the lake.", 1.0),
    ("skateboard, drive", "He was skateboarding and driving.", 1.0),
    ("dish, wash, knife", "She washed the dishes and knives.", 1.0),
    ("dog, run, ball", "The dog sat.", 1 / 3),
    ("dog, dog, cat", "A cat.", 0.5),
    ("dog, run, ball", "", 0.0),
    ("dog, run, ball", "dogma runner balloon", 0.0),
    ("sing, score", "A sign and a scorer.", 0.0),
]


@pytest.mark.parametrize("concepts,pred,want", COVERAGE)
def test_coverage(concepts, pred, want):
  assert metrics.coverage_score(pred, concepts) == pytest.approx(want)


def _q(task, gold, metric, choices=None, **meta):
  return types.Query(qid=f"{task}/test/0", task_name=task, domain="x", query="q?",
                     ground_truth=gold, metric=metric, choices=choices, split="test", meta=meta)


def test_score_dispatches_on_llmrouter_rows():
  # Task names and metric names as written in the LLMRouter files.
  assert metrics.score("\\boxed{28}", _q("agentverse-mgsm", "28", "MATH")) == 1
  assert metrics.score("Answer: 28.0", _q("agentverse-mgsm", "28", "MATH")) == 1
  assert metrics.score("#### 20,000", _q("gsm8k", "... #### 20,000", "GSM8K")) == 1
  assert metrics.score("It is Ben Gibbard.", _q("natural_qa", "Ben Gibbard", "f1_score")) == 1
  mc = "{'label': ['A', 'B', 'C', 'D', 'E'], 'text': ['w', 'x', 'y', 'z', 'v']}"
  assert metrics.score("Answer: b", _q("commonsense_qa", "B", "em_mc", mc)) == 1
  assert metrics.score("Answer: a", _q("commonsense_qa", "B", "em_mc", mc)) == 0
  lg = "{'text': ['1', '2', '3'], 'labels': ['A', 'B', 'C']}"
  assert metrics.score("Answer: 3", _q("agentverse-logicgrid", "C", "em_mc", lg)) == 1
  assert metrics.score("Answer: D", _q("mmlu", "D", "em_mc", "['a', 'b', 'c', 'd']")) == 1
  cg = "dog, run"
  assert metrics.score("Dogs run.", _q("commongen", cg, "commongen_coverage")) == 1
  assert metrics.score("\\boxed{y=1-2x}", _q("math", "\\boxed{y=-2x+1}", "MATH")) == 1
  # A task outside the registry is scored by the row's metric name.
  assert metrics.score("(C)", _q("my_quiz", "C", "em_mc", "['a', 'b', 'c']")) == 1
  # Aliases in meta count for CEM.
  assert metrics.score("Bayreuth", _q("trivia_qa", "bayreuth germany", "cem",
                                      aliases=["Bayreuth"])) == 1


def test_score_bad_rows():
  with pytest.raises(errors.ConfigError, match="unknown metric"):
    metrics.score("x", _q("my_quiz", "C", "bleu"))
  with pytest.raises(errors.DataError, match="no number"):
    metrics.score("18", _q("gsm8k", "no digits here", "GSM8K"))
  with pytest.raises(errors.ConfigError, match="differ in length"):
    metrics.score_many(["a", "b"], [_q("gsm8k", "1", "GSM8K")])


def test_scores_are_in_unit_interval_on_junk():
  rows = [_q("gsm8k", "#### 3", "GSM8K"), _q("math", "\\boxed{3}", "MATH"),
          _q("mmlu", "A", "em_mc", "['a', 'b']"), _q("trivia_qa", "x", "cem"),
          _q("commongen", "a, b", "coverage")]
  junk = ["", "\x00\x01", "}}}{{{\\boxed{", "A" * 10_000, "\\boxed{" * 50, "1/0", "nan"]
  for row in rows:
    for pred in junk:
      s = metrics.score(pred, row)
      assert 0.0 <= s <= 1.0
