"""Served reward per window when the pool changes at request T, through the HTTP API on the
simulator: frozen, memory-only and learning router servers, and the retrained router as reference
(docs/serving.md, Learning while serving, Served pool events).

For each seed a router is trained (experiments/configs/test.py with --n_train training queries,
--episodes training episodes and the seed), and its reference: the same config and size trained on
the post-event pool (the event on every training query, t = 0: served_events.retrained_overrides,
as the drift study retrains). Four servers, each from a fresh served-state folder, serve the
drift study's event (serve_router --sim_event=EVENT --sim_event_t=T: its LLM, delta and price
scale) and get the same stream: the seed's training queries in order, --requests of them (no
cycling: request i is training query i, so the requests i >= T are post-event), --clients at a
time with the official openai client (benchmarks/bench_learning.stream; with --rate R request i is
sent no earlier than i / R seconds after the first, else each wave as soon as the last is
answered; --rate_arms names the arms paced, the others unpaced). Each answer is scored as
a client with the task metric would score it (exact match of the final answer; an unanswered
request, 502, scores 0 and its feedback is 0), its served reward is score - alpha x cost:
  frozen     no feedback;
  memory     feedback = the score (the history memory grows, the weights stay);
  learning   --learn (--learn_args) with the same feedback;
  retrained  the reference router, no feedback.

Reported: per window of --window requests, each arm's mean served reward with its 95% interval
over the window's requests of every seed; gap closure (arm - frozen) / (retrained - frozen) of
the mean served rewards over requests [T + 50, min(T + 1000, --requests)) per seed, with its mean
and paired 95% interval over seeds (gp_jax/runs/studies/drift_report.closure_over_seeds: a seed
where the retrained router gains nothing there is undefined and left out, and counted); a figure
(served reward per window per arm, mean over seeds with the 95% band). Results are written to
--out/<event>_seed<S>/<arm>.json as they finish (a rerun skips finished arms and trained routers),
the summary to --out/<event>_summary.json and the figure to --out/<event>.png.

Targets, written before the run (issue 27, CPU size, alpha 0.5, simulator): after quality_drop
and fail, the learning server closes >= 0.7 of the gap between the frozen server and the retrained
router within 1,000 served requests: mean gap closure >= 0.7 over [T + 50, T + 1000) with the
paired 95% interval's lower end above 0. A second measure, fixed before its first look
(docs/serving.md): the gap closure of the seed-mean rewards (drift_report.closure_of_seed_means;
defined when retrained - frozen averages >= MIN_GAP over the seeds), met when it is >= 0.7 and
the paired 95% interval over seeds of arm - frozen has its lower end above 0. The routers here
are smaller than CPU size (the test config's pool and --episodes), and a run with fewer requests
(the stream's end before T + 1000) is smaller still: every run is labelled a reduced size, and it
can miss or meet the targets only at that size.

  python benchmarks/bench_learning_events.py --event fail --event_at 100 --seeds 0,1,2 \
      --requests 300 --n_train 300 --episodes 192 --window 50 --out /tmp/bench_events
"""
import argparse
import asyncio
import io
import math
import pathlib
import tempfile
import time

import numpy as np

from benchmarks import bench_learning
from experiments import serve_router_process as process
from experiments.configs import test as test_config
from gp_jax import config_lists
from gp_jax import errors
from gp_jax import files
from gp_jax import stats
from gp_jax.runs import pipeline
from gp_jax.runs import system as system_lib
from gp_jax.runs.studies import drift_report
from gp_jax.serving.engine import config as served_config
from gp_jax.sim import served_events
from gp_jax.util import config_overrides

ARMS = ("frozen", "memory", "learning", "retrained")
CLOSURE_AFTER, CLOSURE_LEN = 50, 950   # gap closure over [T + 50, T + 1000)
MIN_GAP = 0.05   # the seed-mean closure is defined when retrained - frozen averages >= this


def config_for(seed: int, n_train: int, episodes: int):
  c = test_config.get_config()
  c.seed, c.data.n_train, c.train.episodes = int(seed), int(n_train), int(episodes)
  return c


def trained(config, workdir: pathlib.Path) -> pathlib.Path:
  """A router trained with `config` in `workdir` (kept when its best checkpoint exists)."""
  if not (workdir / "checkpoints").exists():
    pipeline.train_and_evaluate(config, workdir, evaluate=False, verbose=False)
  return workdir


def serve_arm(arm: str, workdir, event: served_events.ServedEvent, queries, args, alpha: float,
              folder: pathlib.Path) -> list[dict]:
  extra = ["--learn"] + args.learn_args.split() if arm == "learning" else []
  srv = process.RouterProcess([f"--workdir={workdir}", f"--memory_path={folder / 'memory.npz'}",
                               f"--sim_event={event.kind}", f"--sim_event_llm={event.llm}",
                               f"--sim_event_t={event.t}", f"--sim_event_delta={event.delta}",
                               f"--sim_event_scale={event.price_scale}", *extra],
                              folder / "server.log").start()
  try:
    return asyncio.run(bench_learning.stream(srv.url, queries, args.requests, args.clients,
                                             alpha, feedback=arm in ("memory", "learning"),
                                             rate=args.rate if arm in args.rate_arms else 0.0))
  finally:
    srv.stop()


def run_seed(seed: int, event: served_events.ServedEvent, args, out: pathlib.Path) -> dict:
  """{arm: per-request rewards} of one seed (finished arms read back)."""
  config = config_for(seed, args.n_train, args.episodes)
  base = trained(config, out / f"router_seed{seed}")
  re = config_overrides.apply(config, served_events.retrained_overrides(event))
  ref = trained(re, out / f"{event.kind}_retrained_seed{seed}")
  served = served_config.load_config(base)
  queries = system_lib.build(served).train_queries
  alpha = float(served.alpha)
  cell = out / f"{event.kind}_seed{seed}"
  rewards = {}
  for arm in ARMS:
    path = cell / f"{arm}.json"
    if path.exists():
      rewards[arm] = errors.read_json(path, "benchmark arm")["rewards"]
      continue
    t0 = time.time()
    res = serve_arm(arm, ref if arm == "retrained" else base, event, queries, args, alpha,
                    cell / arm)
    rewards[arm] = [r["reward"] for r in res]
    files.write_json(path, dict(arm=arm, seed=seed, event=event.to_dict(),
                                requests=args.requests, seconds=time.time() - t0,
                                unanswered=sum(not r["answered"] for r in res),
                                versions=sorted({r["version"] for r in res} - {None}),
                                rewards=rewards[arm]), "benchmark arm")
    print(f"[{event.kind} seed {seed}] {arm}: {np.mean(rewards[arm][event.t:]):.4f} after T "
          f"({time.time() - t0:.0f} s)", flush=True)
  return rewards


def summary(by_seed: dict, event: served_events.ServedEvent, args) -> dict:
  seeds = sorted(by_seed)
  lo = event.t + CLOSURE_AFTER
  hi = min(event.t + CLOSURE_AFTER + CLOSURE_LEN, args.requests)
  windows = []
  for w in range(0, args.requests, args.window):
    row = dict(lo=w, hi=min(w + args.window, args.requests))
    for arm in ARMS:
      mean, half, n = stats.ci95([x for s in seeds for x in by_seed[s][arm][w:row["hi"]]])
      row[arm] = dict(mean=mean, half=half, n=n)
    windows.append(row)
  closure, means = {}, {}
  for arm in ARMS:
    mean, half, _ = stats.ci95([float(np.mean(by_seed[s][arm][lo:hi])) for s in seeds])
    means[arm] = dict(mean=mean, half=half,
                      per_seed=[float(np.mean(by_seed[s][arm][lo:hi])) for s in seeds])
  for arm in ("memory", "learning"):
    closure[arm] = drift_report.closure_over_seeds(
        [by_seed[s][arm] for s in seeds], [by_seed[s]["frozen"] for s in seeds],
        [by_seed[s]["retrained"] for s in seeds], lo, hi)
    diff = [a - f for s in seeds for a, f in zip(by_seed[s][arm][lo:hi],
                                                 by_seed[s]["frozen"][lo:hi])]
    mean, half, _ = stats.ci95(diff)
    closure[arm]["minus_frozen_per_request"] = dict(mean=mean, half=half)
    closure[arm]["of_seed_means"] = drift_report.closure_of_seed_means(
        [by_seed[s][arm] for s in seeds], [by_seed[s]["frozen"] for s in seeds],
        [by_seed[s]["retrained"] for s in seeds], lo, hi, MIN_GAP)
  # Always reduced in router size (the test config's 3-LLM pool, --episodes); also in requests
  # when the stream ends before T + 1000.
  reduced = ["routers: experiments/configs/test.py (3 LLMs), "
             f"{args.episodes} training episodes (CPU size: experiments/configs/default.py)"]
  if hi < event.t + CLOSURE_AFTER + CLOSURE_LEN:
    reduced.append(f"requests: the stream ends at {hi} < T + 1000")
  met = {arm: bool(c["mean"] >= 0.7 and c["mean"] - c["half"] > 0) for arm, c in closure.items()
         if not math.isnan(c["mean"]) and not math.isnan(c["half"])}
  met_seed_means = {}
  for arm, c in closure.items():
    m = c["of_seed_means"]
    if not math.isnan(m["closure"]) and not math.isnan(m["minus_frozen_half"]):
      met_seed_means[arm] = bool(m["closure"] >= 0.7
                                 and m["minus_frozen"] - m["minus_frozen_half"] > 0)
  return dict(event=event.to_dict(), seeds=seeds, requests=args.requests, window=args.window,
              n_train=args.n_train, episodes=args.episodes, clients=args.clients,
              rate=args.rate, rate_arms=list(args.rate_arms), learn_args=args.learn_args,
              closure_window=[lo, hi], reduced_size=reduced, windows=windows,
              closure_means=means, closure=closure, target_met=met,
              target_met_seed_means=met_seed_means)


def figure(s: dict, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4))
  x = [(w["lo"] + w["hi"] - 1) / 2 for w in s["windows"]]
  for arm in ARMS:
    m = np.array([w[arm]["mean"] for w in s["windows"]])
    h = np.array([w[arm]["half"] for w in s["windows"]])
    ax.plot(x, m, marker="o", label=arm)
    ax.fill_between(x, m - h, m + h, alpha=0.15)
  ax.axvline(s["event"]["t"], color="k", ls="--", lw=1)
  ax.axvspan(*s["closure_window"], color="grey", alpha=0.08)
  e = s["event"]
  ax.set_title(f"Served pool event {e['kind']} ({e['llm']}) at request {e['t']}; "
               f"seeds {','.join(map(str, s['seeds']))} (reduced size)", fontsize=9)
  ax.set_xlabel(f"served request (windows of {s['window']}; shaded: gap-closure window)")
  ax.set_ylabel("served reward (score - alpha x cost), 95% band")
  ax.legend(fontsize=8)
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=120)
  files.write_atomic(path, buf.getvalue(), "benchmark figure")
  plt.close(fig)


def print_summary(s: dict) -> None:
  e = s["event"]
  print(f"\n{e['kind']} ({e['llm']}, delta {e['delta']:g}, price scale {e['price_scale']:g}) at "
        f"request {e['t']}; seeds {s['seeds']}; {s['requests']} requests, {s['clients']} at a "
        f"time, " + (f"paced at {s['rate']:g} requests/s ({', '.join(s['rate_arms'])}; the "
                     "others unpaced)" if s.get("rate") else "unpaced") +
        f"; routers: test config, n_train {s['n_train']}, {s['episodes']} episodes; "
        f"learning: {s['learn_args']}" + "; REDUCED SIZE: " + "; ".join(s["reduced_size"]))
  print("| requests | " + " | ".join(ARMS) + " |")
  print("|---" * (len(ARMS) + 1) + "|")
  for w in s["windows"]:
    print(f"| {w['lo']}-{w['hi'] - 1} | " + " | ".join(
        f"{w[a]['mean']:.4f} +- {w[a]['half']:.4f}" for a in ARMS) + " |")
  lo, hi = s["closure_window"]
  print(f"mean served reward over requests [{lo}, {hi}), per seed mean +- 95% over seeds: " +
        "; ".join(f"{a} {m['mean']:.4f} +- {m['half']:.4f} "
                  f"({', '.join(f'{v:.4f}' for v in m['per_seed'])})"
                  for a, m in s["closure_means"].items()))
  for arm, c in s["closure"].items():
    d = c["minus_frozen_per_request"]
    print(f"gap closure {arm}: {c['mean']:.3f} +- {c['half']:.3f} (paired 95% over seeds; per "
          f"seed {', '.join(f'{v:.3f}' for v in c['per_seed'])}; undefined {c['undefined']}); "
          f"{arm} - frozen per request {d['mean']:+.4f} +- {d['half']:.4f}; target met: "
          f"{s['target_met'].get(arm, 'undefined')}")
    m = c.get("of_seed_means")
    if m:
      print(f"  closure of the seed means {arm}: {m['closure']:.3f} (mean gap {m['gap']:.4f}, "
            f"defined at >= {m['min_gap']:g}; per seed gap "
            f"{', '.join(f'{v:.4f}' for v in m['per_seed_gap'])}); {arm} - frozen over seeds "
            f"{m['minus_frozen']:+.4f} +- {m['minus_frozen_half']:.4f}; target met: "
            f"{s.get('target_met_seed_means', {}).get(arm, 'undefined')}")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--event", required=True, choices=served_events.KINDS)
  ap.add_argument("--event_at", type=int, required=True)
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--requests", type=int, default=300)
  ap.add_argument("--n_train", type=int, default=0, help="training queries (0: --requests)")
  ap.add_argument("--episodes", type=int, default=192, help="training episodes per router")
  ap.add_argument("--window", type=int, default=50)
  ap.add_argument("--clients", type=int, default=8)
  ap.add_argument("--rate", type=float, default=0.0,
                  help="requests per second (0: each wave of --clients as soon as the last is "
                       "answered)")
  ap.add_argument("--rate_arms", default=",".join(ARMS),
                  help="the arms --rate paces (comma separated; the others are unpaced)")
  ap.add_argument("--learn_args", default="--learn_every=32")
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  args.n_train = args.n_train or args.requests
  seeds = [int(x) for x in config_lists.names(args.seeds)]
  args.rate_arms = tuple(config_lists.names(args.rate_arms))
  unknown = sorted(set(args.rate_arms) - set(ARMS))
  if unknown:
    raise SystemExit(f"error: --rate_arms names unknown arms {unknown} (arms: {', '.join(ARMS)})")
  if (args.requests < 1 or args.window < 2 or args.clients < 1 or not seeds
      or args.n_train < args.requests or args.episodes < 1 or not args.rate >= 0):
    raise SystemExit("error: need --requests >= 1, --window >= 2, --clients >= 1, seeds, "
                     "--episodes >= 1, --rate >= 0 and --n_train >= --requests (the stream does "
                     "not cycle)")
  if not 0 < args.event_at + CLOSURE_AFTER < args.requests:
    raise SystemExit(f"error: --event_at + {CLOSURE_AFTER} must lie inside the stream of "
                     f"{args.requests} requests")
  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="bench_learning_events_"))
  event = process.drift_event(args.event, args.event_at)
  t0 = time.time()
  try:
    by_seed = {s: run_seed(s, event, args, out) for s in seeds}
  except errors.GpJaxError as e:
    raise SystemExit(f"error: {e}") from None
  s = summary(by_seed, event, args)
  s["seconds"] = time.time() - t0
  files.write_json(out / f"{event.kind}_summary.json", s, "benchmark summary")
  figure(s, out / f"{event.kind}.png")
  print_summary(s)
  print(f"figure {out / f'{event.kind}.png'}; summary {out / f'{event.kind}_summary.json'}; "
        f"{s['seconds']:.0f} s")


if __name__ == "__main__":
  main()
