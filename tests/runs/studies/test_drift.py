"""Drift study: windowed reward-since-event curves, the 95% interval, recovery, settings and the
report on small hand-made cells; a tiny study end to end (every arm, a failing LLM, the optimum as
ceiling, resume); cells of an older study refused (the study itself runs at CI size in the
experiments stage)."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from experiments.configs import study as study_config
from gp_jax import errors
from gp_jax.baselines import labels as labels_lib
from gp_jax.baselines import single_round
from gp_jax.runs import system as system_lib
from gp_jax.runs.studies import drift
from gp_jax.runs.studies import drift_report
from gp_jax.runs.studies import report as report_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import roles as roles_lib

REPO = __import__("pathlib").Path(__file__).resolve().parents[3]


def test_window_means_align_at_the_event():
  r = np.arange(10, dtype=float)          # reward of query i is i
  offsets, means = drift_report.window_means(r, t=5, window=2)
  # windows [1,3) [3,5) before the event, [5,7) [7,9) after; [9,10) is incomplete: dropped.
  assert offsets.tolist() == [-4, -2, 0, 2]
  assert means.tolist() == [1.5, 3.5, 5.5, 7.5]
  offsets, means = drift_report.window_means(r, t=0, window=3)
  assert offsets.tolist() == [0, 3, 6] and means.tolist() == [1.0, 4.0, 7.0]
  with pytest.raises(ValueError):
    drift_report.window_means(r, t=11, window=2)
  with pytest.raises(ValueError):
    drift_report.window_means(r, t=2, window=0)


def test_window_curve_interval_over_seeds():
  a = np.array([0., 0., 1., 1.])
  b = np.array([0., 2., 1., 3.])
  c = drift_report.window_curve([a, b], t=2, window=1)
  assert c["offsets"] == [-2, -1, 0, 1] and c["seeds"] == 2
  assert c["mean"] == [0.0, 1.0, 1.0, 2.0]
  half = stats.t.ppf(0.975, 1) * np.std([0., 2.], ddof=1) / math.sqrt(2)
  assert c["half"][0] == 0.0 and c["half"][1] == pytest.approx(half)
  one = drift_report.window_curve([a], t=2, window=2)
  assert one["mean"] == [0.0, 1.0] and all(math.isnan(h) for h in one["half"])


def test_recovery():
  ref = np.array([9., 9., 1., 1., 1., 1.])   # retrained: mean 1.0 after the event at t=2
  router = np.array([5., 5., 0., 0., .5, .9])
  assert drift_report.recovery(router, ref, t=2, after=2, window=2) == pytest.approx(0.7)
  assert drift_report.recovery(router, ref, t=2, after=0, window=1) == 0.0
  assert math.isnan(drift_report.recovery(router, -ref, t=2, after=0, window=1))   # no positive reference
  with pytest.raises(ValueError, match="does not fit"):
    drift_report.recovery(router, ref, t=2, after=3, window=2)


def test_gap_closure():
  f, r = np.array([0.0, 0.2, 0.2, 0.2]), np.array([0.0, 0.6, 0.6, 0.6])
  assert drift_report.gap_closure(np.array([0, 0.5, 0.4, 0.3]), f, r, 1, 4) == pytest.approx(0.5)
  assert math.isnan(drift_report.gap_closure(f, f, f, 1, 4))     # retraining gains nothing
  with pytest.raises(ValueError, match="does not fit"):
    drift_report.gap_closure(f, f, r, 2, 5)
  c = drift_report.closure_over_seeds([r, f], [f, f], [r, f], 1, 4)
  assert c["per_seed"][0] == 1.0 and math.isnan(c["per_seed"][1]) and c["undefined"] == 1
  assert c["mean"] == 1.0 and math.isnan(c["half"])


def test_closure_of_seed_means_divides_by_no_seed_own_gap():
  f, r = np.array([0.0, 0.2, 0.2, 0.2]), np.array([0.0, 0.6, 0.6, 0.6])
  # Seed 0: gap 0.4, arm gains 0.2; seed 1: no gap, arm gains 0.1 (closure_over_seeds drops it;
  # here it counts): (0.2 + 0.1) / 2 over (0.4 + 0) / 2 = 0.75.
  c = drift_report.closure_of_seed_means([f + 0.2, f + 0.1], [f, f], [r, f], 1, 4, min_gap=0.05)
  assert c["closure"] == pytest.approx(0.75) and c["gap"] == pytest.approx(0.2)
  assert c["minus_frozen"] == pytest.approx(0.15) and c["minus_frozen_half"] > 0
  assert c["per_seed_gap"] == pytest.approx([0.4, 0.0])
  # A mean gap under the floor: undefined, whatever the arm did.
  c = drift_report.closure_of_seed_means([f + 0.2, f + 0.1], [f, f], [f + 0.04, f + 0.04], 1, 4,
                                         min_gap=0.05)
  assert math.isnan(c["closure"]) and c["minus_frozen"] == pytest.approx(0.15)
  with pytest.raises(ValueError, match="does not fit"):
    drift_report.closure_of_seed_means([f], [f], [r], 2, 5, min_gap=0.05)
  with pytest.raises(ValueError, match="one per seed"):
    drift_report.closure_of_seed_means([f, f], [f], [r], 1, 4, min_gap=0.05)


def _cell(kind, seed, shift, old=False):
  n, t = 8, 4
  base = np.full(n, 0.5)
  after = np.arange(n) >= t
  rewards = dict(online=base - shift * after, frozen=base - 0.2 * after,
                 no_history=base - 0.3 * after, retrained=np.full(n, 0.4),
                 optimum=np.full(n, 0.8), **{"single:a": np.full(n, 0.1), "single:b": np.full(n, 0.3)})
  extra = {}
  if not old:   # the arms added with the baselines and the recency window
    rewards.update({"multi:router_r1": base - 0.5 * after, "multi:knn": np.full(n, 0.2),
                    "router:best_single": np.full(n, 0.3), "router:knn": base - 0.1 * after,
                    "online_recent": base - 0.15 * after})
    extra = dict(closure_after=1, closure_len=3, online_parallel=2,
                 online_row_utility="per-call credit of the scored utility",
                 event_llm="a", event_llm_share={
        a: [0.5, 0.1 + seed * 0.2] for a in ("online", "online_recent", "frozen", "no_history",
                                             "retrained", "optimum")})
  return dict(study="drift", variant=kind, seed=seed, alpha=0.5, t=t, window=2, recovery_after=2,
              n_test=n, eval_overrides={"data.sim_events.fail.llm": "a"},
              rewards={k: v.tolist() for k, v in rewards.items()}, **extra)


def _write(root, cells):
  for c in cells:
    d = root / f"{c['variant']}_seed{c['seed']}"
    d.mkdir(parents=True)
    (d / "cell.json").write_text(json.dumps(c))


def test_summary_and_report(tmp_path):
  cells = [_cell("fail", 0, 0.1), _cell("fail", 1, 0.3)]
  s = drift_report.summarize(cells)["fail"]
  assert s["best"] == {drift_report.BEST_SINGLE: "single:b", drift_report.BEST_ROUTER: "router:knn"}
  assert set(s["arms"]) == set(drift.ARMS) | {drift_report.BEST_SINGLE, drift_report.BEST_ROUTER}
  online = s["arms"]["online"]
  assert online["pre"][0] == pytest.approx(0.5) and online["post"][0] == pytest.approx(0.3)
  assert online["recovery"][0] == pytest.approx(np.mean([0.4 / 0.4, 0.2 / 0.4]))
  assert online["curve"]["offsets"] == [-4, -2, 0, 2]
  r1 = s["arms"]["multi:router_r1"]      # the new arms: curves, means and recovery
  assert r1["curve"]["mean"] == pytest.approx([0.5, 0.5, 0.0, 0.0])
  assert r1["post"][0] == pytest.approx(0.0) and r1["recovery"][0] == pytest.approx(0.0)
  assert s["arms"]["multi:knn"]["recovery"][0] == pytest.approx(0.5)
  assert s["arms"][drift_report.BEST_ROUTER]["post"][0] == pytest.approx(0.4)
  assert s["arms"][drift_report.BEST_SINGLE]["recovery"][0] == pytest.approx(0.75)
  assert "recovery" not in s["arms"]["optimum"] and "recovery" not in s["arms"]["retrained"]
  assert s["arms"]["online"]["share"][1][0] == pytest.approx(0.2)   # mean over the two seeds
  # gap closure over [5, 8): frozen 0.3, retrained 0.4; online 0.4 and 0.2 on the two seeds
  clo = s["arms"]["online"]["closure"]
  assert clo["per_seed"] == pytest.approx([1.0, -1.0]) and clo["mean"] == pytest.approx(0.0)
  assert (clo["lo"], clo["hi"]) == (5, 8) and clo["undefined"] == 0
  assert s["arms"]["no_history"]["closure"]["mean"] == pytest.approx(-1.0)
  assert "closure" not in s["arms"]["frozen"] and "closure" not in s["arms"]["optimum"]
  vs = s["vs_frozen"]      # online = frozen - (shift - 0.2) after t: 0.1 and -0.1 on the two seeds
  assert vs["online"]["diff"][0] == pytest.approx(0.0) and vs["online"]["changed"] == 4.0
  assert vs["no_history"]["diff"][0] == pytest.approx(-0.1) and vs["no_history"]["queries"] == 4
  assert "share" not in s["arms"]["multi:knn"] and s["event_llm"] == "a"
  _write(tmp_path, cells)
  out = drift_report.write_report(tmp_path)
  text = out.read_text()
  assert "| share of calls on a |" in text and "| 0.50 / 0.20 |" in text
  assert "| no_history | -0.100 ± 0.000 | 4.0 of 4 |" in text
  assert "| online | 0.500 ± 0.000 | 0.300 ± " in text and (tmp_path / "report.png").stat().st_size
  assert "| multi:router_r1 | 0.500 ± 0.000 | 0.000 ± 0.000 | 0.000 ± 0.000 |" in text
  assert "| best single-round router (after the fact) [router:knn] | 0.500 ± 0.000 | 0.400 ± " in text
  assert "| best single LLM (after the fact) [single:b] | 0.300 ± " in text
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "cell.json").write_text(json.dumps({"variant": "x"}))
  with pytest.raises(errors.DataError, match="not a drift study cell"):
    drift_report.load_cells(tmp_path)


def test_the_combined_report_has_the_drift_section(tmp_path):
  _write(tmp_path / "studies" / "drift", [_cell("fail", 0, 0.1), _cell("fail", 1, 0.3)])
  out = report_lib.write_full_report(tmp_path, tmp_path / "report.md")
  text = out.read_text()
  assert f"## {drift_report.TITLE}" in text and "| multi:knn | 0.200 ± 0.000 | 0.200 ± 0.000 |" in text
  assert (tmp_path / "report_drift.png").stat().st_size > 1000
  _write(tmp_path / "studies" / "drift_retrieval", [_cell("fail", 0, 0.2)])   # a second drift run
  text = report_lib.write_full_report(tmp_path, tmp_path / "report.md").read_text()
  assert f"## {drift_report.TITLE} [drift_retrieval]" in text and f"## {drift_report.TITLE}\n" in text
  assert (tmp_path / "report_drift_retrieval.png").stat().st_size > 1000


def test_cells_without_the_baseline_arms_are_refused(tmp_path):
  """Cells written before the baseline arms existed are never mixed with new ones: the report,
  the summary and a rerun of the study refuse them, the rerun before anything is written."""
  old = tmp_path / "old"
  _write(old, [_cell("fail", 0, 0.1, old=True), _cell("fail", 1, 0.3)])
  for call in (lambda: drift_report.load_cells(old), lambda: drift_report.summarize([_cell("fail", 0, 0, True)])):
    with pytest.raises(errors.DataError, match="no online_recent, multi:router_r1, multi:knn arm"):
      call()
  c = study_config.get_config("test")
  with pytest.raises(errors.DataError, match="fail_seed0/cell.json has no online_recent, multi:router_r1"):
    drift.DriftRunner(c, old, verbose=False).run([0])
  assert not (old / "config.json").exists() and not (old / "train").exists()
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-m", "experiments.study", "--study=drift",
                        "--config=experiments/configs/study.py:test", f"--workdir={old}"],
                       cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
  lines = [l for l in (out.stdout + out.stderr).splitlines() if l.strip()]
  assert out.returncode == 2, out.stderr[-2000:]
  assert lines[-1].startswith("error: ") and "has no online_recent, multi:router_r1" in lines[-1]
  assert sum(l.startswith("error: ") for l in lines) == 1
  assert not (old / "config.json").exists()


def test_carried_policy_renames_actions_by_role_and_llm():
  roles = roles_lib.load_roles().select(["planner", "executor", "summarizer"])
  src = mdp.ActionSpace(roles, ("a", "b"))
  dst = mdp.ActionSpace(roles, ("a", "b", "c"))   # c joined: the old router cannot pick it
  seen = []

  def policy(query, state, mask, rng):
    seen.append(np.asarray(mask))
    return src.encode("executor", "b")
  mask = np.zeros(dst.size, bool)
  mask[[dst.encode("executor", "b"), dst.encode("executor", "c"), dst.encode("planner", "a")]] = True
  act = drift.carried_policy(policy, src, dst)
  assert act(None, None, mask, None) == dst.encode("executor", "b")
  want = np.zeros(src.size, bool)
  want[[src.encode("executor", "b"), src.encode("planner", "a")]] = True
  assert seen[0].tolist() == want.tolist()
  same = drift.carried_policy(policy, src, src)
  assert same(None, None, want, None) == src.encode("executor", "b")


def _tiny_config(events: str):
  c = study_config.get_config("test")
  c.train.episodes = 16
  c.data.n_test = 12
  c.study.drift_events = events
  c.study.drift_t, c.study.drift_window, c.study.drift_recovery_after = 4, 2, 4
  c.study.drift_closure_after, c.study.drift_closure_len = 2, 6
  c.study.drift_r1_episodes = 16
  c.study.drift_routers = "best_single,knn"
  return c


def _best_single_llm(c) -> str:
  """The LLM the best_single router picks for every query of seed 0 (the study's own fit)."""
  cfg = c.copy_and_resolve_references()
  cfg.seed = 0
  sysm = system_lib.build(cfg)
  data = labels_lib.collect(sysm, sysm.train_queries, seed=0)
  r = single_round.make_router("best_single").fit(data, sysm.catalog)
  x = labels_lib.embed(sysm, sysm.test_queries[:1])
  return sysm.space.llms[int(r.choose(x, float(cfg.alpha), np.random.default_rng(0))[0])]


def test_tiny_study_every_arm_a_failing_llm_and_resume(tmp_path, capsys):
  """Events fail (of the LLM the best_single router routes everything to) and join at query 4 of
  12: every arm is in the cell; the routers that keep routing to the failed LLM get nothing from
  query 4 on; the optimum is the ceiling of every arm in every window; a rerun skips the cells."""
  c = _tiny_config("fail,join")
  c.model.row_layout = 2          # opt-in (layout 1 is the default): its online rows are labelled
  c.study.drift_llm = _best_single_llm(c)
  work = tmp_path / "drift"
  res = drift.DriftRunner(c, work).run([0])
  assert res["ran"] == [("fail", 0), ("join", 0)]
  s = drift.settings(c)
  for kind in ("fail", "join"):
    cell = json.loads((work / f"{kind}_seed0" / "cell.json").read_text())
    r = {k: np.asarray(v) for k, v in cell["rewards"].items()}
    assert set(drift.arms(s)) <= set(r) and all(len(v) == 12 for v in r.values())
    assert {k for k in r if k.startswith("single:")} == {f"single:{m}" for m in cell["llms"]}
    assert cell["online_parallel"] == 4 and (cell["closure_after"], cell["closure_len"]) == (2, 6)
    assert cell["online_row_utility"] == "per-call credit of the scored utility"   # layout 2
    for name, v in r.items():
      gap = drift_report.window_means(r["optimum"], 4, 2)[1] - drift_report.window_means(v, 4, 2)[1]
      assert gap.min() >= -1e-6, (kind, name, gap)
    if kind == "fail":
      for name in ("router:best_single", f"single:{c.study.drift_llm}"):
        assert r[name][:4].mean() > 0.05 and np.all(r[name][4:] <= 1e-9), (name, r[name])
      assert r["optimum"][4:].mean() > 0.05
      # the optimum never calls the failed LLM after t
      assert cell["event_llm_share"]["optimum"][1] == 0.0
      assert cell["event_llm_share"]["optimum"][2] == 0.0 and len(cell["event_llm_share"]["online"]) == 3
    else:   # the join LLM is in the configured pool: the router meeting it was trained without it
      join = c.study.drift_join_llm
      assert join in cell["llms"] and len(cell["llms"]) == 3 and cell["event_llm"] == join
      assert join not in cell["pre_event_overrides"]["llms"].split(",")
      shares = cell["event_llm_share"]
      assert set(shares) == {"online", "online_recent", "frozen", "no_history", "retrained",
                             "optimum"}
      assert all(v[0] == 0.0 for v in shares.values())   # masked before the event
      assert shares["optimum"][1] > 0.0
  summary = drift_report.summarize(drift_report.load_cells(work))
  assert set(summary["fail"]["arms"]) == set(drift.ARMS) | {drift_report.BEST_SINGLE, drift_report.BEST_ROUTER}
  assert "multi:knn" in capsys.readouterr().err
  again = drift.DriftRunner(c, work, verbose=False).run([0])
  assert again["ran"] == [] and len(again["skipped"]) == 2
  text = drift_report.markdown(drift_report.load_cells(work), None)
  assert "| share of calls on" in text and "Gap closure (arm - frozen)" in text
  assert "online rows: per-call credit of the scored utility" in text
def test_settings_validate():
  c = study_config.get_config("test")
  s = drift.settings(c)
  assert s.events == drift.EVENTS and s.t == 8 and s.routers == ("best_single", "knn", "mlp")
  assert drift.arms(s)[-3:] == ("router:best_single", "router:knn", "router:mlp")
  for bad in (dict(drift_closure_len=0), dict(drift_closure_after=20), dict(drift_online_parallel=0)):
    b = study_config.get_config("test")
    b.study.update(bad)
    with pytest.raises(errors.ConfigError):
      drift.settings(b)
  kw = drift.multi_kwargs(c)
  assert (kw["r1_episodes"], kw["r1_batch"], kw["knn_k"]) == (32, 16, 10)
  assert kw["r1_ppo"].clip_eps == c.ppo.clip_eps and kw["r1_ppo"].learning_rate == 1e-3
  ev, re = drift.event_overrides("join", s, c)   # the join LLM is in the configured pool
  pool = system_lib.configured_llms(c)
  assert s.join_llm in pool and ev["llms"] == ",".join(pool) and re["data.sim_events.join.t"] == 0
  assert drift.pre_event_overrides("join", s, c) == {
      "llms": ",".join(m for m in pool if m != s.join_llm)}
  assert drift.pre_event_overrides("fail", s, c) == {}
  c.study.drift_join_llm = "mistral-nemo-12b-instruct"   # an LLM new to the configured pool
  s2 = drift.settings(c)
  ev, _ = drift.event_overrides("join", s2, c)
  assert ev["llms"] == ",".join(pool + [s2.join_llm])
  assert drift.pre_event_overrides("join", s2, c) == {}
  assert ev["data.sim_events.splits"] == "test" and re["data.sim_events.splits"] == "train"
  for field, value, match in [("drift_t", 0, "inside the test stream"),
                              ("drift_recovery_after", 20, "must fit"),
                              ("drift_events", "quake", "drift event"),
                              ("drift_join_llm", "gpt-9", "unknown drift_join_llm"),
                              ("drift_recent_rows", 0, "drift_recent_rows"),
                              ("backend", "endpoints", "needs backend='simulator'"),
                              ("drift_routers", "knn,oracle", "unknown router"),
                              ("drift_router_llm", "gpt-5", "unknown router LLM"),
                              ("drift_r1_batch", 3, "not a multiple")]:
    c = study_config.get_config("test")
    if field == "backend":
      c.backend = value
    else:
      c.study[field] = value
    with pytest.raises(errors.ConfigError, match=match):
      drift.settings(c)
