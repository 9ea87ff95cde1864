"""Study runner: overrides, history remapping across action spaces, a tiny study end to end."""
import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments.configs import study as study_config
from gp_jax import errors
from gp_jax.graph import history as history_lib
from gp_jax.rl import loop as loop_lib
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs.studies import definitions
from gp_jax.runs.studies import report
from gp_jax.runs.studies import runner
from gp_jax.util import config_overrides
from gp_jax.workflow import mdp
from gp_jax.workflow import roles as roles_lib


def test_apply_overrides_sets_nested_fields_and_rejects_unknown():
  c = study_config.get_config("test")
  d = config_overrides.apply(c, {"mdp.phase1_depth": 1, "roles": "planner,executor,summarizer"})
  assert d.mdp.phase1_depth == 1 and c.mdp.phase1_depth == 0     # the original is untouched
  with pytest.raises(errors.ConfigError, match="unknown config field 'mdp.nope'"):
    config_overrides.apply(c, {"mdp.nope": 1})
  with pytest.raises(errors.ConfigError, match="unknown config field"):
    config_overrides.apply(c, {"nosuch.field": 1})


def test_remap_history_by_role_and_llm_name():
  roles = roles_lib.load_roles()
  src = mdp.ActionSpace(roles.select(["planner", "executor", "summarizer"]), ("a", "b"))
  dst = mdp.ActionSpace(roles.select(["planner", "executor", "summarizer", "thinker"]), ("c", "a", "b"))
  mem = history_lib.HistoryMemory(2, src.size, capacity=10)
  hubs = np.arange(src.size)
  mem.add(np.arange(2 * src.size, dtype=np.float32).reshape(-1, 2), hubs)
  out = runner.remap_history(mem, src, dst)
  assert len(out) == len(mem) and out.num_hubs == dst.size
  for a, b in zip(hubs, out.hubs):
    role, llm = src.decode(int(a))
    role2, llm2 = dst.decode(int(b))
    assert (role.name, llm) == (role2.name, llm2)
  np.testing.assert_array_equal(out.rows, mem.rows)
  # Actions missing from the destination are dropped.
  small = mdp.ActionSpace(roles.select(["planner", "executor", "summarizer"]), ("b",))
  assert len(runner.remap_history(mem, src, small)) == 3


def test_unknown_study_and_bad_variant():
  c = study_config.get_config("test")
  with pytest.raises(errors.ConfigError, match="unknown study 'nope'"):
    definitions.variants("nope", c)
  with pytest.raises(errors.ConfigError, match="history must be"):
    runner.StudyRunner(c, "/tmp/unused", "x", [runner.Variant("a", history="bad")])
  with pytest.raises(errors.ConfigError, match="unknown config field"):
    runner.StudyRunner(c, "/tmp/unused", "x", [runner.Variant("a", train={"model.nope": 1})])
  kept = definitions.variants("ablations", c, "no_history, transductive")
  assert [v.name for v in kept] == ["transductive", "no_history"]   # the study's order
  assert len(definitions.variants("ablations", c, "")) == len(definitions.ablations(c))
  with pytest.raises(errors.ConfigError, match="unknown ablations variant 'nope'.*no_history"):
    definitions.variants("ablations", c, "transductive,nope")


def test_every_study_definition_builds():
  c = study_config.get_config("test")
  for name in definitions.STUDIES:
    vs = definitions.variants(name, c)
    assert len({v.name for v in vs}) == len(vs) >= 3
  roles = {v.name: v for v in definitions.variants("roles", c)}
  assert roles["pestv_trained"].train["mdp.step_cap"] >= 19   # room for thinker + verifier calls
  assert [v.few_shot_updates for v in roles.values() if v.few_shot] == [0, 1, 1]
  assert roles["pestv_few_shot_rounds"].few_shot_rounds == c.study.few_shot_rounds > 1
  unseen = {v.name: v for v in definitions.variants("unseen", c)}
  held = c.study.unseen_llms
  assert held in c.llms.split(",")                  # by default an LLM of the pool is held out
  for name in ("train_llms", "unseen_llms", "unseen_llms_served", "unseen_llms_few_shot"):
    assert unseen[name].train["llms"].split(",") == [m for m in c.llms.split(",") if m != held]
  assert unseen["unseen_llms"].evaluate["llms"] == c.llms     # added back at evaluation
  assert unseen["unseen_llms_retrained"].train == {}           # the plain run, shared
  assert unseen["unseen_llms_served"].few_shot_updates == 0 and unseen["unseen_llms"].held_out == (held,)
  c.study.unseen_llms = "mistral-nemo-12b-instruct"             # a catalog LLM new to the pool
  train, full, _ = definitions.held_out_pools(c)
  assert train == c.llms and full == c.llms + ",mistral-nemo-12b-instruct"
  for bad, match in [("gpt-9", "unknown unseen LLM"), ("", "at least one"), (c.llms, "at least one")]:
    c.study.unseen_llms = bad
    with pytest.raises(errors.ConfigError, match=match):
      definitions.variants("unseen", c)


def test_learner_study_arms():
  c = study_config.get_config("test")
  vs = {v.name: v for v in definitions.variants("learner", c)}
  assert list(vs) == ["study", "sweep_ppo", *definitions.LEARNER_OPTIONS]   # no combined arm
  assert vs["study"].train == {} and vs["sweep_ppo"].train == definitions.SWEEP_PPO
  for name, option in definitions.LEARNER_OPTIONS.items():   # each option alone on sweep_ppo
    assert vs[name].train == {**definitions.SWEEP_PPO, **option}
    config_overrides.apply(c, vs[name].train)                 # every key exists in the config
  assert all(v.routers == ("mlp",) and v.split_agreement for v in vs.values())
  c.study.learner_combined = "forced, gamma1"
  combined = definitions.variants("learner", c)[-1]
  assert combined.name == "combined" and combined.train == {
      **definitions.SWEEP_PPO, "ppo.gamma": 1.0, "train.force_planner_episodes": 600}
  for bad, match in [("nope", "unknown learner option 'nope'"), ("gamma1,gamma1", "repeated")]:
    c.study.learner_combined = bad
    with pytest.raises(errors.ConfigError, match=match):
      definitions.variants("learner", c)


def test_tiny_study_end_to_end_resumes_and_reports(tmp_path, capsys):
  c = study_config.get_config("test")
  c.train.episodes = 16
  c.data.n_test = 12
  new = tuple(m.name for m in system_lib.full_catalog(c).llms if m.held_out)   # the catalog's three
  held = ",".join(c.llms.split(",") + list(new))
  variants = [runner.Variant("base", split_agreement=True),
              runner.Variant("empty_history", history="none"),
              runner.Variant("more_llms", evaluate={"llms": held}, held_out=new,
                             few_shot=4, few_shot_rounds=2)]
  work = tmp_path / "studies" / "toy"
  res = runner.StudyRunner(c, work, "toy", variants, verbose=True).run([0])
  assert len(res["ran"]) == 3
  err = capsys.readouterr().err.splitlines()   # progress: cell i of n, then cells done + ETA
  assert [l for l in err if l.startswith("[toy study] cell ")] == [
      "[toy study] cell 1/3: base seed=0", "[toy study] cell 2/3: empty_history seed=0",
      "[toy study] cell 3/3: more_llms seed=0"]
  done = [l for l in err if l.startswith("[toy study] ") and " cells (" in l]
  assert done[0].startswith("[toy study] 1/3 cells (33%)  last base seed=0 | ") and "ETA" in done[0]
  assert done[-1].startswith("[toy study] 3/3 cells (100%)")
  assert any(l.startswith("[train] ") for l in err) and any(l.startswith("[eval ") for l in err)
  cells = {v.name: json.loads((work / f"{v.name}_seed0" / runner.CELL_FILE).read_text())
           for v in variants}
  assert len(list((work / "train").iterdir())) == 1            # one training run shared by all
  rows = {r["policy"]: r for r in cells["more_llms"]["rows"] if r["domain"] == "all"}
  assert "GraphPlanner[more_llms]" in rows and "optimum (DP)" in rows
  assert len(cells["more_llms"]["llms"]) == 6 and rows["GraphPlanner[more_llms]"]["n"] == 12
  assert sum(cells["base"]["shares"]["llm"].values()) == pytest.approx(1.0)
  share = cells["more_llms"]["held_out_share"]      # shares of calls on the three new LLMs
  assert share["router"] == pytest.approx(sum(cells["more_llms"]["shares"]["llm"].get(m, 0.0)
                                              for m in new))
  assert 0.0 <= share["optimum"] <= 1.0 and cells["base"]["held_out_share"] is None
  # split agreement only where the variant asks for it; the training return's tail recorded
  base = {r["policy"]: r for r in cells["base"]["rows"] if r["domain"] == "all"}
  assert base["GraphPlanner[base]"]["split_precision"] is not None or \
      base["GraphPlanner[base]"]["split_rate"] == 0
  assert rows["GraphPlanner[more_llms]"]["split_recall"] is None
  tdir = next((work / "train").iterdir())
  tail = runner.training_return_tail(tdir)
  assert cells["base"]["train"]["final_return"] == pytest.approx(tail)
  recs = [json.loads(l) for l in (tdir / "metrics.jsonl").read_text().splitlines()]
  assert tail == pytest.approx(recs[-1]["episode_return"])    # 1 iteration: 10% rounds up to 1
  assert cells["more_llms"]["few_shot_rounds"] == 2
  again = runner.StudyRunner(c, work, "toy", variants, verbose=False).run([0])
  assert again["ran"] == [] and len(again["skipped"]) == 3
  out = report.write_full_report(tmp_path, tmp_path / "report.md")
  text = out.read_text()
  assert "| base |" in text and "| more_llms |" in text
  assert (tmp_path / "report_toy.png").stat().st_size > 1000
  # the study's own report (experiments.study writes it after its cells) ...
  own = report.write_study_report(work, "toy")
  assert own == work / "report.md" and "| more_llms |" in own.read_text()
  assert (work / "report.png").stat().st_size > 1000
  # ... and a study folder given to the sweep report is refused with the way to its report
  p = subprocess.run([sys.executable, "-m", "experiments.report", f"--workdir={work}"],
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 2 and "cells of the 'toy' study, not of an alpha sweep" in p.stderr
  assert "Traceback" not in p.stderr


def test_report_runner_errors_exit_2(tmp_path):
  p = subprocess.run([sys.executable, "-m", "experiments.report", f"--root={tmp_path}"],
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 2 and "no finished sweep, study or counselor runs" in p.stderr
  p = subprocess.run([sys.executable, "-m", "experiments.study", "--study=nope",
                      "--config=experiments/configs/study.py:test", f"--workdir={tmp_path}/s"],
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 2 and "unknown study 'nope'" in p.stderr
  p = subprocess.run([sys.executable, "-m", "experiments.study", "--study=ablations",
                      "--variants=transductive,nope", "--config=experiments/configs/study.py:test",
                      f"--workdir={tmp_path}/s"], capture_output=True, text=True, timeout=120)
  assert p.returncode == 2 and "unknown ablations variant 'nope'" in p.stderr
  assert not (tmp_path / "s").exists()     # refused before anything was written


def test_few_shot_recipes():
  """History only leaves the weights alone and grows the history by the served episodes' calls;
  one round with one update is the original recipe; more rounds and updates move the weights
  further; impossible recipes are config errors."""
  c = study_config.get_config("test")
  sysm = system_lib.build(c)
  model = training.make_model(c, sysm.featurizer.spec)
  params = loop_lib.init_state(model, sysm.featurizer, ppo_config.make_optimizer(c), 0).params

  def run(**kw):
    h = history_lib.HistoryMemory(sysm.featurizer.spec.row_dim, sysm.space.size, capacity=10_000)
    out = runner.few_shot_update(c, sysm, model, params, h, 4, 0, **kw)
    return out, len(h)

  def moved(p):
    return max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
               for a, b in zip(jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(params)))
  p0, n0 = run(updates=0)
  p1, n1 = run()
  p3, n3 = run(rounds=3)
  assert moved(p0) == 0.0 and n0 == n1 > 0 and n3 > n1
  assert moved(p1) > 0 and moved(p3) > moved(p1)
  for kw in (dict(updates=-1), dict(rounds=0)):
    with pytest.raises(errors.ConfigError, match="few-shot recipe"):
      run(**kw)
  with pytest.raises(errors.ConfigError, match="few-shot recipe"):   # before any work
    runner.StudyRunner(c, "/tmp/unused", "x", [runner.Variant("a", few_shot=4, few_shot_rounds=0)])
  h = history_lib.HistoryMemory(sysm.featurizer.spec.row_dim, sysm.space.size, capacity=10_000)
  n = len(sysm.train_queries)        # more rounds than the queries fill: they cycle
  runner.few_shot_update(c, sysm, model, params, h, n // 2 + 1, 0, rounds=3, updates=0)
  assert len(h) > 0


def test_optimum_shares_command():
  """The optimum's share of calls per LLM (the CLI in a subprocess): one line per LLM of the
  pool, shares summing to 1; a bad LLM name is one error line and exit 2."""
  p = subprocess.run([sys.executable, "-m", "experiments.optimum_shares",
                      "--config=experiments/configs/study.py:test"],
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  lines = [l.split() for l in p.stdout.splitlines()[1:] if l.strip()]
  c = study_config.get_config("test")
  assert sorted(m for _, m in lines) == sorted(c.llms.split(","))
  assert sum(float(s) for s, _ in lines) == pytest.approx(1.0, abs=2e-3)
  bad = subprocess.run([sys.executable, "-m", "experiments.optimum_shares",
                        "--config=experiments/configs/study.py:test", "--config.llms=nope"],
                       capture_output=True, text=True, timeout=300)
  err = [l for l in bad.stderr.splitlines() if l.strip()]
  assert bad.returncode == 2 and err[-1].startswith("error: unknown LLM 'nope'")


def test_held_out_share_has_no_optimum_off_the_simulator():
  """With a real backend there is no exact optimum: the cell's optimum share is None (the report
  then prints the router's share alone), never a simulator figure."""
  from types import SimpleNamespace as NS
  c = study_config.get_config("test")
  r = runner.StudyRunner(c, "/tmp/unused", "x", [runner.Variant("a")], verbose=False)
  calls = [NS(llm="a", role="executor"), NS(llm="b", role="executor"), NS(llm="b", role="planner")]
  esys = NS(simulated=False, space=NS(llms=("a", "b")))
  v = runner.Variant("u", held_out=("b",))
  share = r._held_out_share(esys, [NS(calls=calls)], v, 0, 0.5)
  assert share == {"router": pytest.approx(2 / 3), "optimum": None}
  assert r._held_out_share(esys, [], runner.Variant("a"), 0, 0.5) is None
  with pytest.raises(errors.ConfigError, match="not in its evaluation pool"):
    r._held_out_share(esys, [], runner.Variant("u", held_out=("z",)), 0, 0.5)


def test_study_report_pairs_each_variant_with_the_first_by_seed():
  """The report's paired table: per seed, a variant's reward minus the first variant's; the mean
  and 95% t interval over the seeds both have (n/a for one seed)."""
  def cell(variant, seed, reward, index):
    rows = [dict(policy=f"{runner.ROUTER}[{variant}]", domain="all", n=10, accuracy=0.5,
                 cost=0.1, reward=reward, calls=1.0)]
    return dict(study="toy", variant=variant, seed=seed, alpha=0.5, simulated=True, rows=rows,
                index=index, n_test=10, train=dict(episodes=8, seconds=1.0), seconds=1.0)
  ref = {0: 0.50, 1: 0.40, 2: 0.60}
  other = {0: 0.52, 1: 0.45, 2: 0.61}   # differences 0.02, 0.05, 0.01
  cells = ([cell("a", s, r, 0) for s, r in ref.items()] +
           [cell("b", s, r, 1) for s, r in other.items()] + [cell("c", 0, 0.3, 2)])
  variants, _ = report.summarize_study(cells)
  diffs = {d["name"]: d for d in report.paired_differences(variants)}
  d = np.array([0.02, 0.05, 0.01])
  assert diffs["b"]["mean"] == pytest.approx(d.mean())
  assert diffs["b"]["half_width"] == pytest.approx(4.302653 * d.std(ddof=1) / np.sqrt(3), rel=1e-5)
  assert diffs["b"]["n"] == 3
  assert diffs["c"]["mean"] == pytest.approx(-0.2) and diffs["c"]["n"] == 1
  md = report.study_markdown("toy", cells, None)
  assert "Reward minus a's, paired by seed" in md
  assert f"| b | +{d.mean():.3f} ± {4.302653 * d.std(ddof=1) / np.sqrt(3):.3f} | 3 |" in md
  assert "| c | -0.200 ± n/a | 1 |" in md
