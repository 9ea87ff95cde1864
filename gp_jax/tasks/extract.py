"""Answer extraction from free-form model output: numbers, \\boxed{} contents, choice labels.

All functions are pure string functions. They never fall back to substring matching: a choice
label is accepted only where the text states it as the answer (or the whole reply is the label).
"""
from __future__ import annotations

import fractions
import re
import unicodedata

# ---------------------------------------------------------------------------------------------
# \boxed{...}

def boxed_contents(text: str) -> list[str]:
  """All \\boxed{...} / \\fbox{...} contents in order, with nested braces balanced.

  `\\boxed 5` (no braces, a single token) is accepted too.
  """
  out = []
  pos = 0
  while True:
    m = re.search(r"\\(?:boxed|fbox)", text[pos:])
    if not m:
      return out
    start = pos + m.end()
    rest = text[start:]
    stripped = rest.lstrip()
    if stripped.startswith("{"):
      i = start + (len(rest) - len(stripped)) + 1
      depth = 1
      j = i
      while j < len(text) and depth:
        if text[j] == "{":
          depth += 1
        elif text[j] == "}":
          depth -= 1
        j += 1
      if depth == 0:
        out.append(text[i:j - 1].strip())
      pos = j
    else:
      tok = re.match(r"\s+([^\s$]+)", rest)
      if tok:
        out.append(tok.group(1).strip())
      pos = start


def last_boxed(text: str) -> str | None:
  """The last \\boxed{} content, or None."""
  boxes = boxed_contents(text)
  return boxes[-1] if boxes else None


# ---------------------------------------------------------------------------------------------
# Numbers

_MINUS = "\u2212\u2013\u2014\ufe63\uff0d"  # unicode minus and dashes used as minus signs.
# A number token: optional sign and currency, digits with optional thousands separators, optional
# decimals, or a fraction a/b. Digits are not allowed to touch letters/digits on the left so that
# "x2" or "H2O" do not yield 2; commas must separate groups of exactly three digits.
_NUM_RE = re.compile(
    r"(?<![\w.])(?P<sign>-)?\s?(?:[$\u00a3\u20ac\u00a5]\s?)?(?P<sign2>-)?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+|\.\d+)"
    r"(?:\s?/\s?(?P<den>\d+(?:\.\d+)?)(?![\d.]))?")
_LATEX_FRAC_RE = re.compile(r"(-)?\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(-?\d+)\s*\}")


def _clean_numeric_text(text: str) -> str:
  text = unicodedata.normalize("NFKC", text)
  for ch in _MINUS:
    text = text.replace(ch, "-")
  # LaTeX fractions and thousands separators written as "1{,}000" or "1\,000".
  text = _LATEX_FRAC_RE.sub(lambda m: f"{m.group(1) or ''}{m.group(2)}/{m.group(3)}", text)
  text = text.replace("{,}", ",").replace("\\,", ",").replace("\\!", "")
  text = text.replace("\\$", "$").replace("\\%", "%")
  return text


def parse_number(text: str) -> fractions.Fraction | None:
  """Parses one number written in any common way; None if `text` holds no single number.

  Accepts "18", "18.0", "-18", "$1,234.50", "3/4", "\\frac{3}{4}", "25%", "18 dollars". Returns an
  exact Fraction so that 18.0 == 18 and 0.5 == 1/2 compare equal.
  """
  nums = find_numbers(text)
  if len(nums) != 1:
    return None
  return nums[0]


def find_numbers(text: str) -> list[fractions.Fraction]:
  """All numbers in `text`, in order (see parse_number for the accepted forms)."""
  text = _clean_numeric_text(text)
  out = []
  for m in _NUM_RE.finditer(text):
    val = _to_fraction(m.group("num"))
    if val is None:
      continue
    if m.group("den") is not None:
      den = _to_fraction(m.group("den"))
      if not den:
        continue
      val = val / den
    if m.group("sign") or m.group("sign2"):
      val = -val
    out.append(val)
  return out


def _to_fraction(s: str) -> fractions.Fraction | None:
  try:
    return fractions.Fraction(s.replace(",", ""))
  except (ValueError, ZeroDivisionError):
    return None


# Phrases that introduce a stated final answer.
_ANSWER_CUE_RE = re.compile(
    r"(?:final\s+answer|the\s+answer|answer|correct\s+(?:answer|option|choice)|"
    r"correct\s+one|solution)\s*(?:is|would\s+be|will\s+be|=|:)?\s*[:=]?",
    re.IGNORECASE)


def _strip_markdown(text: str) -> str:
  return text.replace("**", "").replace("__", "").replace("`", "")


def final_number(text: str) -> fractions.Fraction | None:
  """The number a model states as its final answer.

  Order of precedence: the last \\boxed{} that holds a number; the last "####" marker; the last
  "answer is / Answer:" statement; otherwise the last number in the text.
  """
  for box in reversed(boxed_contents(text)):
    nums = find_numbers(box)
    if nums:
      return nums[-1]
  text = _strip_markdown(text)
  if "####" in text:
    nums = find_numbers(text.rsplit("####", 1)[1])
    if nums:
      return nums[0]
  cues = list(_ANSWER_CUE_RE.finditer(text))
  for cue in reversed(cues):
    segment = text[cue.end():cue.end() + 80].split("\n")[0]
    nums = find_numbers(segment)
    if nums:
      return nums[0]
  nums = find_numbers(text)
  return nums[-1] if nums else None


# ---------------------------------------------------------------------------------------------
# Multiple-choice labels


def _label_alt(labels) -> str:
  return "|".join(re.escape(l) for l in sorted(labels, key=len, reverse=True))


def extract_choice(text: str, labels, texts=None, filler_words=()) -> str | None:
  """The option label a reply chooses, or None when it states no choice.

  Accepted (in order of precedence; within a level the last statement wins):
    1. \\boxed{B} / \\boxed{\\text{(B)}};
    2. an answer statement: "Answer: B", "the answer is (b).", "correct option is B)",
       "Answer: $B$"; a bare lower-case label (or "A") followed by more words is read as an
       article ("the answer is a bus depot") unless those words are that option's own text;
    3. a line that holds only the label: "B", "(B)", "B)", "B.", "Option B"; or, when `texts`
       are given, the marked label followed by that option's own text: "(B) Paris.",
       "B. Paris", "B) Paris", "B: Paris" (an unmarked "A Paris" stays an article);
    4. when `texts` are given: an answer statement or the whole reply equal to one option's text
       (after lower-casing, dropping punctuation and `filler_words`).
  Labels are never found by substring search.

  Args:
    text: the model's reply.
    labels: option labels of the row, e.g. ["A", "B", "C", "D"] or ["1", "2", "3", "4"].
    texts: option texts, parallel to labels (optional).
    filler_words: words ignored when comparing to option texts (e.g. "house").

  Returns:
    One of `labels`, or None.
  """
  labels = [str(l) for l in labels]
  if not text or not labels:
    return None
  by_upper = {l.upper(): l for l in labels}
  alt = _label_alt(labels)
  clean = _strip_markdown(unicodedata.normalize("NFKC", text))

  # 1. \boxed{...}
  for box in reversed(boxed_contents(clean)):
    inner = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", box)
    inner = inner.strip().strip("$").strip()
    m = re.fullmatch(rf"\(?\s*({alt})\s*\)?\.?", inner, re.IGNORECASE)
    if m:
      return by_upper[m.group(1).upper()]
    if texts is not None:
      hit = _match_text(inner, labels, texts, filler_words)
      if hit:
        return hit

  # 2. answer statements.
  stmt_re = re.compile(
      r"\b(?:final\s+answer|answer|correct\s+(?:answer|option|choice)|"
      r"best\s+(?:answer|option|choice)|i\s+(?:choose|pick|select))\b"
      r"\s*(?:is|would\s+be|will\s+be|should\s+be)?\s*(?:option|choice|letter)?\s*[:=]?\s*"
      rf"\$?\s*(?:\\text\{{)?(?P<open>[\(\[]\s*)?(?<![A-Za-z0-9])(?P<label>{alt})(?![A-Za-z0-9])"
      r"(?P<close>\s*[\)\]])?(?:\})?\$?(?=(?P<after>[^\n]*))",
      re.IGNORECASE)
  found = None
  for m in stmt_re.finditer(clean):
    lab, after = m.group("label"), m.group("after")
    if lab.upper() not in by_upper:
      continue
    bare = not (m.group("open") or m.group("close"))
    if bare and re.match(r"\s+[A-Za-z]", after) and (lab.islower() or lab in ("A", "I")):
      # "the answer is a bus depot": an article, unless the words are that option's own text.
      if texts is None:
        continue
      idx = [l.upper() for l in labels].index(lab.upper())
      opt = _norm_option(str(texts[idx]), filler_words)
      if not opt or not _norm_option(after, filler_words).startswith(opt):
        continue
    found = by_upper[lab.upper()]
  if found:
    return found

  # 3. a line that is just the label, or the marked label and that option's own text.
  line_re = re.compile(rf"^\s*(?:option|choice)?\s*[\(\[]?\s*({alt})\s*[\)\]]?\s*[.:]?\s*$",
                       re.IGNORECASE)
  # A marker (an opening bracket, or ")", "]", ".", ":" right after the label) must separate
  # the two, so "A because ..." never reads as option A's text.
  text_line_re = re.compile(
      rf"^\s*(?:option|choice)?\s*(?:[\(\[]\s*({alt})\s*[\)\]]?|({alt})\s*[\)\].:])"
      r"\s*(?P<rest>\S.*)$", re.IGNORECASE)
  lines = clean.strip().splitlines()
  with_text = {}   # line index -> label, for "(B) <option B's text>" lines
  for k, line in enumerate(lines if texts is not None else ()):
    m = text_line_re.match(line)
    if m:
      lab = (m.group(1) or m.group(2)).upper()
      opt = _norm_option(str(texts[[l.upper() for l in labels].index(lab)]), filler_words)
      if opt and _norm_option(m.group("rest"), filler_words) == opt:
        with_text[k] = by_upper[lab]
  if len(set(with_text.values())) > 1:   # the options restated one per line: no choice
    with_text = {}
  for k in reversed(range(len(lines))):
    m = line_re.match(lines[k])
    if m:
      return by_upper[m.group(1).upper()]
    if k in with_text:
      return with_text[k]

  # 4. the option text itself.
  if texts is not None:
    cues = list(_ANSWER_CUE_RE.finditer(clean))
    for cue in reversed(cues):
      segment = clean[cue.end():].split("\n")[0]
      hit = _match_text(segment, labels, texts, filler_words)
      if hit:
        return hit
    lines = [l for l in clean.strip().splitlines() if l.strip()]
    if lines:
      hit = _match_text(lines[-1], labels, texts, filler_words)
      if hit:
        return hit
  return None


def _norm_option(s: str, filler_words) -> str:
  s = s.lower().strip()
  s = re.sub(r"[^\w\s.\-/]", " ", s)
  s = s.strip(" .")
  words = [w for w in s.split() if w not in filler_words]
  while words and words[0] in ("a", "an", "the"):
    words = words[1:]
  return " ".join(words)


def _match_text(segment: str, labels, texts, filler_words) -> str | None:
  seg = _norm_option(segment, filler_words)
  if not seg:
    return None
  hits = [l for l, t in zip(labels, texts) if _norm_option(str(t), filler_words) == seg]
  return hits[0] if len(hits) == 1 else None
