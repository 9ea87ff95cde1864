"""Torch-side timing of the authors' released GraphPlanner code (CPU), by history-table size.

  PY="$(bash scripts/setup_torch_ref.sh)"
  "$PY" benchmarks/bench_official_torch.py --repo=/tmp/GraphPlanner [--history_rows=1000,10000,100000]

Run by the torch venv's python (scripts/setup_torch_ref.sh), never by gp_jax's. For each history
size H it builds the released RouteAgent (dblayer backbone, loaded as in
tests/graph/make_official_reference.py) with random tables and times
  (a) one decision: `RouteAgent.select_action` (policy_old and value under torch.no_grad, as
      released), the median over --repeats calls;
  (b) one `RouteAgent.update` over a full 32-transition buffer (buffer_size=32, k_epochs=1,
      batch 32), the median over --update_repeats calls.
Each measurement runs in a child process: one that would need more memory than is available
(estimated; the update keeps every forward's [H, 2d+2] history input for backward) or that runs
past --cap_s is recorded as skipped, with the reason, instead of hanging. Prints one JSON object:
{"torch", "threads", "results": [{"history_rows", "decision_ms", "update_ms", "note"}]}. On a
shared machine, --threads=1 gives steadier numbers than torch's default thread pool.
"""
import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUFFER = 32


def _reference_module():
  """tests/graph/make_official_reference.py (the released-code loader and table builders)."""
  path = os.path.join(REPO, "tests", "graph", "make_official_reference.py")
  spec = importlib.util.spec_from_file_location("_make_official_reference", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _available_bytes():
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _estimated_bytes(args, H, what):
  """Rough peak memory: the history table (numpy + per-row tensors) plus each forward's
  [H, 2d+2] input and [H, h] activations, all kept alive for backward in an update."""
  row = (2 * args.embed_dim + 2) * 4
  forwards = 2 * BUFFER if what == "update" else 1
  return H * (3 * row + forwards * (row + 8 * args.hidden_dim * 4)) + (1 << 28)


class _OverCap(Exception):
  pass


def _over_cap(signum, frame):
  raise _OverCap()


def _child(args, H, what):
  ref = _reference_module()
  net = ref.load_network(args.repo)
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  d, A, Q, L = args.embed_dim, 3 * args.num_llms, args.num_queries, args.local_rows
  agent = net.RouteAgent(embed_dim=d, hidden_dim=args.hidden_dim, k_epochs=1, buffer_size=BUFFER,
                         device=torch.device("cpu"), gnn_backbone="dblayer")
  query_table, llm_table = ref.global_tables((0.5 * rng.standard_normal((Q, d))).astype(np.float32),
                                             (0.5 * rng.standard_normal((A, 2 * d))).astype(np.float32))
  his = ref.memory_table(ref.random_rows(rng, H, d), rng.integers(0, Q, H), rng.integers(0, A, H), args.num_llms)
  his_tables = {"memory_table": his, "query_table": query_table, "LLM_table": llm_table}

  def observation():
    q, n = int(rng.integers(0, Q)), int(rng.integers(0, L + 1))
    local = ref.memory_table(ref.random_rows(rng, n, d), [q] * n, rng.integers(0, A, n), args.num_llms)
    state = torch.tensor(0.5 * rng.standard_normal((1, d)), dtype=torch.float32)
    return state, local, [q, int(rng.integers(0, 2))], np.ones(A, np.float32)

  signal.signal(signal.SIGALRM, _over_cap)
  times = []
  if what == "decision":
    state, local, hi, mask = observation()
    lt = {"memory_table": local, "query_table": query_table, "LLM_table": llm_table}
    calls = [lambda: agent.select_action(state, lt, his_tables, torch.tensor(hi), action_mask=mask)] * args.repeats
  else:
    for i in range(BUFFER):
      state, local, hi, mask = observation()
      agent.store_transition(state, int(rng.integers(0, A)), float(rng.standard_normal()), float(-np.log(A)),
                             float(rng.standard_normal()), i % 4 == 3, local, hi, mask)
    history = ref.HistoryMemory(his)
    calls = [lambda: agent.update(query_table, llm_table, history, BUFFER)] * args.update_repeats
  signal.setitimer(signal.ITIMER_REAL, args.cap_s)
  try:
    for call in calls:
      t0 = time.perf_counter()
      call()
      times.append(time.perf_counter() - t0)
  except _OverCap:
    return {"skipped": f"{what} over the {args.cap_s:g} s cap after {len(times)} of {len(calls)} calls"}
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
  return {"ms": 1000 * statistics.median(times), "calls": len(times)}


def _measure(args, H, what):
  need, have = _estimated_bytes(args, H, what), _available_bytes()
  if need > 0.8 * have:
    return {"skipped": f"{what} needs ~{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available"}
  cmd = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:] + [f"--_child={what}:{H}"]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3 * args.cap_s + 300)
  except subprocess.TimeoutExpired:
    return {"skipped": f"{what} child did not finish within {3 * args.cap_s + 300:g} s"}
  if proc.returncode != 0:
    why = "killed (out of memory?)" if proc.returncode < 0 else (proc.stderr.strip().splitlines() or [""])[-1]
    return {"skipped": f"{what} child exited {proc.returncode}: {why}"}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repo", required=True, help="checkout of ulab-uiuc/GraphPlanner")
  ap.add_argument("--embed_dim", type=int, default=768)
  ap.add_argument("--hidden_dim", type=int, default=32)
  ap.add_argument("--num_llms", type=int, default=9, help="actions A = 3 * num_llms")
  ap.add_argument("--num_queries", type=int, default=500)
  ap.add_argument("--history_rows", default="1000,10000,100000", help="comma-separated H values")
  ap.add_argument("--local_rows", type=int, default=8, help="at most this many workflow rows per observation")
  ap.add_argument("--repeats", type=int, default=10, help="decision calls timed (median)")
  ap.add_argument("--update_repeats", type=int, default=1, help="update calls timed (median)")
  ap.add_argument("--cap_s", type=float, default=120.0, help="per-measurement time cap, seconds")
  ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
  ap.add_argument("--_child", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.threads > 0:
    torch.set_num_threads(args.threads)
  if args._child:
    what, H = args._child.split(":")
    print(json.dumps(_child(args, int(H), what)))
    return
  results = []
  for H in [int(h) for h in args.history_rows.split(",") if h.strip()]:
    dec, upd = _measure(args, H, "decision"), _measure(args, H, "update")
    notes = [r["skipped"] for r in (dec, upd) if "skipped" in r]
    if not notes:
      notes = [f"decision: median of {dec['calls']} select_action calls; update: median of {upd['calls']} "
               f"update calls (32 transitions, k_epochs=1, batch 32)"]
    results.append({"history_rows": H, "decision_ms": round(dec["ms"], 3) if "ms" in dec else None,
                    "update_ms": round(upd["ms"], 3) if "ms" in upd else None, "note": "; ".join(notes)})
  print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "results": results}))


if __name__ == "__main__":
  main()
