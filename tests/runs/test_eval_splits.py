"""Splits in the evaluation (gp_jax/runs/evaluate.py): every policy's split rate, the router's
split recall and precision against the DP optimum's splits, in eval.json, eval.md and the
TensorBoard event file beside them."""
import dataclasses
import itertools
import json
import types

import pytest

from experiments.configs import test as test_config
from gp_jax.rl import loop as rl_loop
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.sim.scoring import Row
from tests.util import tb_reader


def _brute(router, optimum):
  """Recall and precision by counting queries one by one."""
  both = opt = rtr = 0
  for r, o in zip(router, optimum):
    both += r and o
    opt += o
    rtr += r
  return (both / opt if opt else None), (both / rtr if rtr else None)


def test_split_agreement_counts_like_brute_force():
  cases = [([True, False, True, True, False], [True, True, False, True, False]),
           ([False] * 4, [True, False, True, False]),      # the router never splits
           ([True, True], [False, False]),                  # the optimum never splits
           ([False, False], [False, False]),
           ([True], [True])]
  cases += [(list(r), list(o)) for r in itertools.product([False, True], repeat=3)
            for o in itertools.product([False, True], repeat=3)]
  for router, optimum in cases:
    assert evaluation.split_agreement(router, optimum) == _brute(router, optimum), (router, optimum)
  assert evaluation.split_agreement([True, False, True, True, False],
                                    [True, True, False, True, False]) == (2 / 3, 2 / 3)
  assert evaluation.split_agreement([False] * 4, [True, False, True, False]) == (0.0, None)
  assert evaluation.split_agreement([True, True], [False, False]) == (None, 0.0)
  with pytest.raises(ValueError):
    evaluation.split_agreement([True], [True, False])


def test_recall_and_precision_per_domain():
  queries = [types.SimpleNamespace(domain=d) for d in ("a", "a", "b", "b", "b")]
  state = lambda planner_calls: types.SimpleNamespace(planner_calls=planner_calls)
  router = [state(1), state(0), state(2), state(0), state(1)]
  optimum = [state(1), state(1), state(0), state(0), state(1)]
  row = lambda policy, domain: Row(policy, domain, 1, 0.0, 0.0, 0.0, 1.0, split_rate=0.0)
  rows = [row(p, d) for p in ("GraphPlanner", "random") for d in ("a", "b", "all")]
  out = {(r.policy, r.domain): r for r in
         evaluation.with_split_agreement(rows, "GraphPlanner", queries, router, optimum)}
  assert (out["GraphPlanner", "a"].split_recall, out["GraphPlanner", "a"].split_precision) == (0.5, 1.0)
  assert (out["GraphPlanner", "b"].split_recall, out["GraphPlanner", "b"].split_precision) == (1.0, 0.5)
  assert (out["GraphPlanner", "all"].split_recall,
          out["GraphPlanner", "all"].split_precision) == (2 / 3, 2 / 3)
  assert all(out["random", d].split_recall is None and out["random", d].split_precision is None
             for d in ("a", "b", "all"))


def test_the_table_keeps_its_columns_and_adds_the_splits(tmp_path):
  rows = [Row("GraphPlanner", "all", 4, 0.5, 0.2, 0.4, 1.0, split_rate=0.0, split_recall=0.0,
              split_precision=None),
          Row("optimum (DP)", "all", 4, 0.75, 0.3, 0.6, 2.5, split_rate=0.5)]
  md = evaluation.format_table(rows, 0.1)
  header = [l for l in md.splitlines() if l.startswith("| policy |")][0]
  assert header.startswith("| policy | n | accuracy | cost (m$) | reward | calls/query |")
  assert header.endswith("| split rate | split recall | split precision |")
  assert "| GraphPlanner | 4 | 0.500 | 0.200 | 0.400 | 1.00 | 0.00 | 0.00 | — |" in md
  assert "| optimum (DP) | 4 | 0.750 | 0.300 | 0.600 | 2.50 | 0.50 | — | — |" in md
  evaluation.write(rows, 0.1, tmp_path / "eval", simulated=True)
  report = json.loads((tmp_path / "eval.json").read_text())
  assert report["rows"][0]["split_precision"] is None and report["rows"][1]["split_rate"] == 0.5
  (path,) = tb_reader.event_files(tmp_path)
  assert path.name.endswith(".report.eval")
  values = tb_reader.read_events(path)[1]["values"]
  assert values["eval/optimum (DP)/split_rate"] == 0.5
  assert values["eval/GraphPlanner/reward"] == pytest.approx(0.4)
  assert "eval/GraphPlanner/split_precision" not in values    # None: no number to plot
  assert values["eval/verdict/ratio_to_optimum"] == pytest.approx(0.4 / 0.6)


def test_an_evaluation_reports_every_policy_split_rate_and_the_router_agreement():
  """A tiny simulated system and an untrained router: the rows' split rates and the router's
  recall and precision are those counted from the policies' own episodes."""
  cfg = test_config.get_config()
  cfg.data.n_train = 8
  cfg.data.n_test = 8
  cfg.text.dim = 16
  cfg.model.hidden = 8
  cfg.model.mlp_hidden = 8
  cfg.model.num_layers = 1
  cfg.model.mem_proj = 4
  sysm = system_lib.build(cfg)
  model = training.make_model(cfg, sysm.featurizer.spec)
  # Initial parameters of seed 3: the greedy router splits some of the queries (3 of 8).
  params = rl_loop.init_state(model, sysm.featurizer, ppo_config.make_optimizer(cfg), 3).params
  rows = evaluation.evaluate(sysm, 0.1, router=(model, params, None), baselines=True,
                             optimum=True, parallel=8, seed=0)
  by = {(r.policy, r.domain): r for r in rows}
  env = sysm.env(0.1)
  queries = sysm.test_queries
  router = [s.planner_calls > 0 for s in evaluation.run_router(
      sysm, env, model, params, None, queries, parallel=8, seed=0)]
  optimum = [s.planner_calls > 0 for s in evaluation.optimum_states(sysm, env, queries, seed=0)]
  assert by["GraphPlanner", "all"].split_rate == pytest.approx(sum(router) / len(router))
  assert by["optimum (DP)", "all"].split_rate == pytest.approx(sum(optimum) / len(optimum))
  assert 0 < sum(router) < len(router) and sum(optimum) > 0
  got = by["GraphPlanner", "all"]
  assert (got.split_recall, got.split_precision) == _brute(router, optimum)
  for r in rows:
    assert 0.0 <= r.split_rate <= 1.0
    if r.policy.startswith("single:"):     # executor-only policies never split
      assert r.split_rate == 0.0
    if r.policy != "GraphPlanner":
      assert r.split_recall is None and r.split_precision is None
  # Without the optimum no agreement is computed.
  no_opt = evaluation.evaluate(sysm, 0.1, router=(model, params, None), baselines=False,
                               optimum=False, parallel=8, seed=0)
  assert all(r.split_recall is None and r.split_precision is None for r in no_opt)
  assert [dataclasses.replace(r, split_recall=None, split_precision=None) for r in rows
          if r.policy == "GraphPlanner"] == no_opt
