"""Served reward per window and decision overhead of a frozen, a memory-only and a learning router
server, through the HTTP API on the simulator (docs/serving.md, Learning while serving).

Three servers of one workdir, each from a fresh served-state folder, get the same query stream:
the workdir's simulated training queries in order, cycled up to --requests, sent --clients at a
time with the official openai client. Every answer is scored as a client with the task metric
would score it (the simulated query's ground truth: exact match of the final answer), and its
served reward is score - alpha x cost (cost in milli-dollars, the training reward).
  frozen    no feedback: the trained router as it is;
  memory    feedback = the score (the history memory grows, the weights stay);
  learning  --learn with the same feedback (the settings below).
With --poison P, two more learning servers get the stream from 9 client keys: "mallory" sends
the requests i with i mod round(1/P) = 0 and inverted feedback (1 - score) on them, 8 honest keys
the rest (so each honest key is under the default per-key share); "guarded" has the default
guards, "unguarded" none (KL and canary margins 1000, key share 1, consistency check off).
--servers runs only the
named ones (a longer stream for fewer comparisons; default: all).
Printed per window of --window requests: mean served reward with its 95% interval, per server;
and the router overhead per decision (server time minus backbone time over decisions) p50/p99 of
each server, side by side (the learner's updates run in the learning server meanwhile).

Targets, written before the run (issue 27, without a pool event): the learning server's reward
stays within 0.01 of the frozen server's; its overhead p99 per decision is within 1.2x of the
memory-only server's. Pool events at request t: benchmarks/bench_learning_events.py (it
shares `stream`). An unanswered request (502) scores 0 at the cost it spent; its feedback is 0
(1 from mallory).

  python benchmarks/bench_learning.py [--workdir DIR] [--requests 384] [--window 64] \
      [--clients 8] [--rate 0] [--learn_args=--learn_every=32] [--poison 0.2] \
      [--servers frozen,learning,guarded]

Without --workdir a router is trained with experiments/configs/test.py into a temporary folder.
"""
import argparse
import asyncio
import json
import pathlib
import tempfile
import urllib.request

import numpy as np
import openai

from gp_jax import stats
from gp_jax.runs import system as system_lib
from gp_jax.serving.engine import config as served_config
from gp_jax.serving.http import auth
from experiments import serve_router_process as process
from gp_jax.sim import simulator as sim
from gp_jax.workflow import reward as reward_lib

MODES = ("frozen", "memory", "learning")
POISONED = ("guarded", "unguarded")
UNGUARDED = ["--learn_max_kl=1000", "--learn_canary_margin=1000", "--learn_max_key_share=1",
             "--learn_key_check_z=0"]
HONEST = [f"user{j}" for j in range(8)]


async def stream(url: str, queries, requests: int, clients: int, alpha: float,
                 feedback: bool, poison_every: int = 0, rate: float = 0.0) -> list[dict]:
  """Sends the stream; returns per request its served reward and router overhead per decision.
  poison_every > 0: request i is mallory's when i % poison_every == 0 (inverted feedback), else
  an honest key's. rate > 0: request i is sent no earlier than i / rate seconds after the first
  (the clients' waves paced; 0: each wave as soon as the last is answered)."""
  def make(key):
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
  clients_by_key = {k: make(k) for k in HONEST + ["mallory"]} if poison_every else {}
  default = make("unused")
  out = []

  async def one(i: int) -> dict:
    q = queries[i % len(queries)]
    bad = bool(poison_every) and i % poison_every == 0
    client = (clients_by_key["mallory" if bad else HONEST[i % len(HONEST)]] if poison_every
              else default)
    try:
      c = await client.chat.completions.create(
          model="graphplanner", messages=[{"role": "user", "content": q.query}],
          metadata={"task": q.task_name}, seed=i)
    except openai.APIStatusError as e:
      if e.status_code != 502:
        raise
      # Unanswered (its backbones failed, e.g. a fail event): score 0 at the cost it spent;
      # the failure is reported as feedback like any outcome.
      rid, cost = e.response.headers["x-gp-request-id"], float(e.response.headers["x-gp-cost-usd"])
      if feedback:
        await client.post("/feedback", body={"id": rid, "score": 1.0 if bad else 0.0},
                          cast_to=object)
      return dict(reward=-alpha * reward_lib.cost_units(cost), overhead=None, version=None,
                  answered=False)
    ext = c.model_extra["graphplanner"]
    score = sim.sim_score(c.choices[0].message.content, q)
    if feedback:
      await client.post("/feedback", body={"id": c.id, "score": 1.0 - score if bad else score},
                        cast_to=object)
    t = ext["timing"]
    return dict(reward=score - alpha * reward_lib.cost_units(ext["cost_usd"]),
                overhead=t["router_s"] / max(t["decisions"], 1), version=ext.get("version"),
                answered=True)
  t0 = asyncio.get_running_loop().time()
  try:
    for start in range(0, requests, clients):
      if rate > 0:
        await asyncio.sleep(max(0.0, t0 + start / rate - asyncio.get_running_loop().time()))
      out += await asyncio.gather(*[one(i) for i in range(start, min(start + clients, requests))])
  finally:
    for c in [default, *clients_by_key.values()]:
      await c.close()
  return out


def _span(versions: list[str]) -> str:
  """'v0' or 'v0-v152 (153 versions)' for the sorted versions a server served."""
  if len(versions) == 1:
    return versions[0]
  return f"{versions[0]}-{versions[-1]} ({len(versions)} versions)"


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workdir", default="")
  ap.add_argument("--requests", type=int, default=384)
  ap.add_argument("--window", type=int, default=64)
  ap.add_argument("--clients", type=int, default=8)
  ap.add_argument("--rate", type=float, default=0.0,
                  help="requests per second (0: each wave of --clients as soon as the last is "
                       "answered)")
  ap.add_argument("--learn_args", default="--learn_every=32")
  ap.add_argument("--poison", type=float, default=0.0,
                  help="share of the stream from a key sending inverted feedback (0: not run)")
  ap.add_argument("--servers", default="",
                  help="comma-separated servers to run, of " + ",".join(MODES + POISONED)
                       + " (default: the three, and the two poisoned ones with --poison)")
  args = ap.parse_args()
  run = MODES + (POISONED if args.poison > 0 else ())
  servers = tuple(args.servers.split(",")) if args.servers else run
  if not set(servers) <= set(run) or len(set(servers)) != len(servers):
    raise SystemExit(f"error: --servers takes names of {', '.join(run)} once each, "
                     f"got {args.servers!r}")
  if args.requests < 1 or args.window < 2 or args.clients < 1 or not args.rate >= 0:
    raise SystemExit("error: --requests >= 1, --window >= 2, --clients >= 1 and --rate >= 0")
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_learning_"))
  workdir = pathlib.Path(args.workdir) if args.workdir else tmp / "router"
  if not args.workdir:
    from experiments.configs import test as test_config
    from gp_jax.runs import pipeline
    pipeline.train_and_evaluate(test_config.get_config(), workdir, evaluate=False, verbose=False)
  config = served_config.load_config(workdir)
  if config.data.source != "simulated" or config.get("backend", "simulator") != "simulator":
    raise SystemExit("error: the benchmark needs a router trained on the simulator")
  queries = system_lib.build(config).train_queries
  alpha = float(config.alpha)
  results, counters = {}, {}
  poison_every = round(1 / args.poison) if args.poison > 0 else 0
  keys = tmp / "keys.json"
  keys.write_text(json.dumps({"keys": [   # the clients, and the admin that reads /health
      {"name": k, "sha256": auth.key_digest(k), "role": "admin" if k == "ops" else "client"}
      for k in HONEST + ["mallory", "ops"]]}))
  for mode in servers:
    state = tmp / mode
    extra = ["--learn"] + args.learn_args.split() if mode not in ("frozen", "memory") else []
    extra += (UNGUARDED if mode == "unguarded" else []) + (
        [f"--api_keys_file={keys}"] if mode in POISONED else [])
    srv = process.RouterProcess([f"--workdir={workdir}", f"--memory_path={state / 'memory.npz'}",
                                 *extra], tmp / f"{mode}.log").start()
    try:
      results[mode] = asyncio.run(stream(srv.url, queries, args.requests, args.clients, alpha,
                                         feedback=mode != "frozen",
                                         poison_every=poison_every if mode in POISONED else 0,
                                         rate=args.rate))
      if extra:   # a learning server: its learner's counters at the end of the stream
        ask = urllib.request.Request(srv.url + "/health", headers={   # a keyed server's
            "Authorization": "Bearer ops"} if mode in POISONED else {})  # needs the admin key
        with urllib.request.urlopen(ask, timeout=30) as r:
          router = json.load(r).get("router") or {}
        counters[mode] = dict(router.get("counters", {}),
                              flagged_keys=router.get("flagged_keys", 0))
    finally:
      srv.stop()
  print(f"workdir {workdir}; {args.requests} requests, {args.clients} at a time, "
        + (f"paced at {args.rate:g} requests/s" if args.rate else "unpaced")
        + f"; learning: {args.learn_args}")
  shown = [m for m in MODES + POISONED if m in results]
  paired = "learning" in results and "frozen" in results
  print("| window | " + " | ".join(f"{m} reward (95% CI)" for m in shown) +
        (" | learning - frozen (paired 95% CI) |" if paired else " |"))
  print("|---" * (len(shown) + 1 + paired) + "|")
  for w in range(0, args.requests, args.window):
    cells = []
    for m in shown:
      mean, half, _ = stats.ci95([r["reward"] for r in results[m][w:w + args.window]])
      cells.append(f"{mean:.4f} +- {half:.4f}")
    if paired:
      diff = [a["reward"] - b["reward"] for a, b in zip(results["learning"][w:w + args.window],
                                                         results["frozen"][w:w + args.window])]
      mean, half, _ = stats.ci95(diff)
      cells.append(f"{mean:+.4f} +- {half:.4f}")
    print(f"| {w}-{min(w + args.window, args.requests) - 1} | " + " | ".join(cells) + " |")
  for m in ("memory", "learning"):
    if m in results and "frozen" in results:
      mean, half, _ = stats.ci95([a["reward"] - b["reward"]
                                  for a, b in zip(results[m], results["frozen"])])
      print(f"{m} - frozen over all requests (paired): {mean:+.4f} +- {half:.4f}")
  for m in POISONED:
    if m in results and "learning" in results:
      mean, half, _ = stats.ci95([a["reward"] - b["reward"]
                                  for a, b in zip(results[m], results["learning"])])
      print(f"poisoned ({m}) - learning over all requests (paired): {mean:+.4f} +- {half:.4f}")
  for m in results:
    mean, half, _ = stats.ci95([r["reward"] for r in results[m]])
    o = np.array([r["overhead"] for r in results[m] if r["answered"]]) * 1e3
    versions = sorted({r["version"] for r in results[m]} - {None}, key=lambda v: int(v[1:]))
    print(f"{m}: all requests reward {mean:.4f} +- {half:.4f}; router overhead per decision "
          f"p50 {np.percentile(o, 50):.2f} ms, p99 {np.percentile(o, 99):.2f} ms"
          + (f"; versions served {_span(versions)}" if versions else ""))
  for m, c in counters.items():
    print(f"{m} learner: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))


if __name__ == "__main__":
  main()
