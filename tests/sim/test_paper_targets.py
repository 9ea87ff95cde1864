"""The paper's preregistered targets (data/paper_targets.json): well-formed, and labelled by the rule."""
from __future__ import annotations

import copy
import json
import math
import pathlib

import pytest

PATH = pathlib.Path(__file__).resolve().parents[2] / "data" / "paper_targets.json"
FIELDS = {"id": str, "quantity": str, "method": str, "family": str, "setting": dict, "kind": str,
          "unit": str, "source": str, "read_from": list, "verified": bool, "simulated": bool,
          "label": str}
CHECKED = ("where", "quoted", "open")
PAPER_TEXT = {"paper_abstract"}  # the sources that are the paper's own text
FAMILIES = {"graphplanner", "baseline", "memory_baseline", "single_llm"}
KINDS = {"value", "difference", "count", "sign"}
NEVER_FIT = {"graphplanner", "memory_baseline"}


def _load() -> dict:
  with open(PATH, encoding="utf-8") as f:
    return json.load(f)


def problems(doc: dict) -> list[str]:
  """Every way `doc` breaks the file's rules, one line each (empty: none)."""
  out = []
  sources = doc.get("about", {}).get("sources", {})
  targets = doc.get("targets")
  if not isinstance(targets, list) or not targets:
    return ["no targets"]
  ids = [t.get("id") for t in targets]
  out += [f"duplicate id {i}" for i in sorted({i for i in ids if ids.count(i) > 1})]
  known = set(ids)
  for t in targets:
    name = t.get("id", "?")
    for field, kind in FIELDS.items():
      if not isinstance(t.get(field), kind):
        out.append(f"{name}: field {field} missing or not {kind.__name__}")
    for field in ("id", "quantity", "method", "unit", "source"):
      if isinstance(t.get(field), str) and not t[field].strip():
        out.append(f"{name}: empty {field}")
    value = t.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      out.append(f"{name}: value {value!r} is not a finite number")
    elif t.get("kind") == "sign" and value not in (-1, 1):
      out.append(f"{name}: a sign is +1 or -1, not {value}")
    if t.get("label") not in ("fit", "holdout"):
      out.append(f"{name}: label {t.get('label')!r} is not fit or holdout")
    if t.get("family") not in FAMILIES:
      out.append(f"{name}: family {t.get('family')!r} unknown")
    if t.get("kind") not in KINDS:
      out.append(f"{name}: kind {t.get('kind')!r} unknown")
    if "graphplanner" in str(t.get("method", "")).lower() and t.get("family") != "graphplanner":
      out.append(f"{name}: method {t.get('method')!r} involves GraphPlanner but its family is "
                 f"{t.get('family')!r}")
    if t.get("label") == "fit" and t.get("family") in NEVER_FIT:
      out.append(f"{name}: family {t.get('family')} may never be fit")
    if t.get("label") == "fit" and t.get("simulated") is not True:
      out.append(f"{name}: fit but not a simulated quantity")
    if isinstance(t.get("read_from"), list):
      if not t["read_from"]:
        out.append(f"{name}: read_from is empty")
      out += [f"{name}: read_from {r!r} is not in about.sources" for r in t["read_from"]
              if r not in sources]
    for part in t.get("aggregate_of", []):
      if part not in known:
        out.append(f"{name}: aggregate_of names unknown id {part}")
    out += _verification_problems(t)
  unverified = doc.get("about", {}).get("unverified")
  if not isinstance(unverified, list):
    out.append("about.unverified missing or not a list")
  else:
    expected = [t.get("id") for t in targets if t.get("verified") is not True]
    out += [f"{i}: unverified but not in about.unverified" for i in expected if i not in unverified]
    out += [f"{i}: in about.unverified but verified or unknown" for i in unverified
            if i not in expected]
  return out


def _verification_problems(t: dict) -> list[str]:
  """A verified entry names where in the paper's own text its number was read, and quotes it."""
  name = t.get("id", "?")
  checked = t.get("checked")
  if t.get("verified") is not True:
    return [f"{name}: 'checked' on an unverified entry"] if checked is not None else []
  if not isinstance(checked, dict) or any(
      not isinstance(checked.get(k), str) or not checked[k].strip() for k in CHECKED):
    return [f"{name}: verified without checked.{{{', '.join(CHECKED)}}}"]
  out = []
  if not PAPER_TEXT & set(t.get("read_from") or []):
    out.append(f"{name}: verified but read_from names no paper-text source")
  value = t.get("value")
  if isinstance(value, (int, float)) and not isinstance(value, bool) and f"{value:g}" not in checked[
      "quoted"]:
    out.append(f"{name}: the quoted text does not contain the value {value:g}")
  return out


def test_the_file_keeps_every_rule():
  assert problems(_load()) == []


def test_about_names_the_paper_the_labels_and_what_is_missing():
  about = _load()["about"]
  assert about["paper"]["arxiv"] == "2604.23626"
  assert about["paper"]["version"].startswith("v1")
  assert set(about["labels"]) == {"fit", "holdout"}
  assert about["rule"] and all(r.strip() for r in about["rule"])
  assert about["missing"] and about["sources"]
  assert set(about["verification"]) >= {"done", "reached", "result"}
  assert all(isinstance(v, str) and v.strip() for v in about["sources"].values())


def test_both_labels_are_used_and_graphplanner_is_never_fit():
  targets = _load()["targets"]
  fit = [t for t in targets if t["label"] == "fit"]
  assert fit and len(fit) < len(targets)
  assert not [t["id"] for t in fit if "graphplanner" in (t["method"] + t["id"]).lower()]


def test_the_targets_the_issue_criteria_use_are_there():
  """The baseline order (fit) and GraphPlanner's calls and headline (holdout) of issue 24."""
  by_id = {t["id"]: t for t in _load()["targets"]}
  for i in ("p2.routerdc.acc", "p2.router_r1.acc", "p2.r2_reasoner.acc"):
    assert by_id[i]["label"] == "fit"
  for i in ("p2.graphplanner.acc", "p2.graphplanner.calls", "p2.graphplanner.cost"):
    assert by_id[i]["label"] == "holdout"


def test_verified_entries_quote_the_paper_and_the_rest_are_listed_unverified():
  doc = _load()
  verified = [t for t in doc["targets"] if t["verified"]]
  assert verified and len(verified) < len(doc["targets"])
  assert {t["id"] for t in verified}.isdisjoint(doc["about"]["unverified"])
  assert len(doc["about"]["unverified"]) + len(verified) == len(doc["targets"])


def test_aggregates_are_the_mean_of_their_parts():
  """The paper rounds its per-task numbers, so a mean may differ from its parts' mean by < 1."""
  targets = _load()["targets"]
  by_id = {t["id"]: t for t in targets}
  aggregates = [t for t in targets if "aggregate_of" in t]
  assert aggregates
  for t in aggregates:
    parts = [by_id[i]["value"] for i in t["aggregate_of"]]
    assert abs(sum(parts) / len(parts) - t["value"]) < 1.0, t["id"]
    assert {by_id[i]["label"] for i in t["aggregate_of"]} == {t["label"]}, t["id"]


def _first(doc, family="baseline", label=None):
  return next(t for t in doc["targets"] if t["family"] == family and label in (None, t["label"]))


def _set(field, value, family="baseline", label=None):
  def change(doc):
    _first(doc, family, label)[field] = value
  return change


def _drop(field):
  def change(doc):
    del _first(doc)[field]
  return change


def _duplicate(doc):
  doc["targets"].append(copy.deepcopy(doc["targets"][0]))


def _aggregate_unknown(doc):
  _first(doc)["aggregate_of"] = ["no.such.id"]


def _verified_entry(doc):
  return next(t for t in doc["targets"] if t["verified"])


def _verify_silently(doc):
  """Marks an entry verified without saying where it was checked."""
  t = next(t for t in doc["targets"] if not t["verified"])
  t["verified"] = True
  doc["about"]["unverified"].remove(t["id"])


def _misquote(doc):
  _verified_entry(doc)["checked"]["quoted"] = "no number here"


def _verified_from_a_digest(doc):
  _verified_entry(doc)["read_from"] = ["digest_results"]


def _still_listed_unverified(doc):
  doc["about"]["unverified"].append(_verified_entry(doc)["id"])


def _unlisted(doc):
  doc["about"]["unverified"].pop()


def _checked_but_unverified(doc):
  next(t for t in doc["targets"] if not t["verified"])["checked"] = {"where": "x", "quoted": "1",
                                                                      "open": "x"}


MUTATIONS = {
    "graphplanner fit": (_set("label", "fit", family="graphplanner"), "may never be fit"),
    "memory baseline fit": (_set("label", "fit", family="memory_baseline"), "may never be fit"),
    "graphplanner hidden as a baseline": (_set("method", "GraphPlanner w/o History"),
                                          "involves GraphPlanner"),
    "unknown label": (_set("label", "train"), "is not fit or holdout"),
    "nan": (_set("value", float("nan")), "not a finite number"),
    "infinity": (_set("value", float("inf")), "not a finite number"),
    "bool": (_set("value", True), "not a finite number"),
    "text": (_set("value", "54.3"), "not a finite number"),
    "empty source": (_set("source", "  "), "empty source"),
    "no source": (_drop("source"), "field source missing"),
    "no read_from": (_set("read_from", []), "read_from is empty"),
    "unknown read_from": (_set("read_from", ["a blog"]), "not in about.sources"),
    "fit, not simulated": (_set("simulated", False, label="fit"), "not a simulated quantity"),
    "half a sign": (_set("kind", "sign"), "a sign is +1 or -1"),
    "duplicate id": (_duplicate, "duplicate id"),
    "unknown aggregate part": (_aggregate_unknown, "unknown id"),
    "no verified field": (_drop("verified"), "field verified missing"),
    "verified, not said where": (_verify_silently, "verified without checked"),
    "verified, quote lacks the value": (_misquote, "does not contain the value"),
    "verified from a digest only": (_verified_from_a_digest, "names no paper-text source"),
    "verified yet listed unverified": (_still_listed_unverified, "in about.unverified but verified"),
    "unverified, not listed": (_unlisted, "not in about.unverified"),
    "checked on an unverified entry": (_checked_but_unverified, "'checked' on an unverified"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_broken_rule_is_caught(name):
  change, expected = MUTATIONS[name]
  doc = _load()
  change(doc)
  found = problems(doc)
  assert any(expected in p for p in found), found
