"""Throughput, latency and router overhead of experiments/serve_router.py at 1 / 16 / 64 / 256 clients.

Two backends: the embedded simulator (backbone time ~0, so the numbers are the router's own
cost) and the local latency-injecting test server (gp_jax/llm/testing_server.py, every call
takes --latency_s). Each client sends --requests requests one after another; all clients run at
once. Printed per (backend, clients): requests/s; p50/p99 end-to-end latency; the router's
overhead per decision (server time minus time awaiting backbones, divided by the request's
decisions; p50/p99 over requests; it includes waiting for the event loop while other requests'
work runs), the router's own compute per decision (features, the request's share of the batched
policy call; no waiting); and, on the test server, throughput against the ideal that backbone
latency and concurrency allow (min(clients, max_concurrency) / (calls per request x latency)).
On the simulator the backbone time is the simulator's own CPU work in the server process.

Side by side, in the same run and server, each client count is also run as plain pass-through
requests (the same texts sent to one backbone by name: one call, no routing), so the routed
overhead and throughput can be read against what the server costs without the router. Requests
answered 429 (the server's bounded queue is full) and requests that time out (--timeout_s) are
counted, not retried. With --pin (default on machines with 2 or more cores) the server process
runs on core 0 and this load generator and the test server on core 1.

  python benchmarks/bench_server.py [--workdir workdirs/alpha0.5] [--latency_s 0.2] \
      [--clients 1,16,64,256] [--max_concurrency 64] [--server_args=--max_queue=128]

Without --workdir a router is trained with experiments/configs/test.py into a temporary folder.
"""
import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import aiohttp
import numpy as np

from experiments import serve_router_process as process
from gp_jax import paths
from gp_jax.llm import catalog as catalog_lib
from gp_jax.runs import system as system_lib


def start_test_server(latency_s: float, models: list[str]) -> tuple[subprocess.Popen, str]:
  proc = subprocess.Popen([sys.executable, "-m", "gp_jax.llm.testing_server", "--port", "0",
                           "--latency_s", str(latency_s), "--models", ",".join(models)],
                          stdout=subprocess.PIPE, text=True, cwd=paths.REPO_ROOT)
  line = proc.stdout.readline().strip()
  if not line.startswith("listening on "):
    proc.kill()
    raise SystemExit(f"error: test server did not start: {line!r}")
  return proc, line.split()[-1] + "/v1"


async def load(url: str, clients: int, requests: int, model: str, timeout_s: float) -> dict:
  """Runs `clients` clients of `requests` sequential requests each to `model` (the router or a
  backbone by name); returns per-request facts of the answered ones and the refusal counts."""
  out, status = [], {"429": 0, "timeout": 0, "other": 0}

  async def client(session, c):
    for r in range(requests):
      body = {"model": model,
              "messages": [{"role": "user", "content": f"Question {c}-{r}: how many moons?"}]}
      t0 = time.perf_counter()
      try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
          data = await resp.json(content_type=None)
          code = resp.status
      except asyncio.TimeoutError:
        status["timeout"] += 1
        continue
      if code == 429:
        status["429"] += 1
        continue
      if code != 200:
        status["other"] += 1
        print(f"request failed with {code}: {data}", file=sys.stderr)
        continue
      ext = data["graphplanner"]
      out.append(dict(e2e=time.perf_counter() - t0, calls=len(ext["route"]), **ext["timing"]))

  conn = aiohttp.TCPConnector(limit=0)
  async with aiohttp.ClientSession(connector=conn,
                                   timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
    await client(session, -1)   # warm-up (connections, first-call paths)
    out.clear()
    t0 = time.perf_counter()
    await asyncio.gather(*[client(session, c) for c in range(clients)])
    wall = time.perf_counter() - t0
  return dict(records=out, wall=wall, status=status)


def summarise(res: dict, clients: int, latency_s: float | None, slots: int) -> dict:
  r = res["records"]
  if not r:
    return dict(clients=clients, requests=0, rps=0.0, p50=np.nan, p99=np.nan, over50=np.nan,
                over99=np.nan, work50=np.nan, work99=np.nan, calls=np.nan, ideal=None,
                rest50=np.nan, rest99=np.nan, **res["status"])
  e2e = np.array([x["e2e"] for x in r])
  per_dec = np.array([x["router_s"] / max(1, x["decisions"]) for x in r])
  work = np.array([x["compute_s"] / max(1, x["decisions"]) for x in r])
  # Everything but the backbones, as the client sees it (HTTP, queueing, router): one number
  # that means the same for routed and pass-through requests.
  rest = np.array([x["e2e"] - x["backbone_s"] for x in r])
  calls = np.mean([x["calls"] for x in r])
  row = dict(clients=clients, requests=len(r), rps=len(r) / res["wall"],
             p50=np.percentile(e2e, 50), p99=np.percentile(e2e, 99),
             over50=np.percentile(per_dec, 50) * 1e3, over99=np.percentile(per_dec, 99) * 1e3,
             work50=np.percentile(work, 50) * 1e3, work99=np.percentile(work, 99) * 1e3,
             rest50=np.percentile(rest, 50) * 1e3, rest99=np.percentile(rest, 99) * 1e3,
             calls=calls, ideal=None, **res["status"])
  if latency_s:   # at most `slots` workflows run at once (the server's max_concurrency)
    row["ideal"] = min(clients, slots) / (calls * latency_s)
  return row


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--workdir", default="", help="trained run to serve (default: train test.py)")
  ap.add_argument("--latency_s", type=float, default=0.2, help="test server latency per call")
  ap.add_argument("--clients", default="1,16,64,256")
  ap.add_argument("--requests", type=int, default=8, help="sequential requests per client")
  ap.add_argument("--backends", default="simulator,testing_server")
  ap.add_argument("--max_concurrency", type=int, default=64, help="the server's workflow slots")
  ap.add_argument("--server_args", default="", help="more serve_router flags, space-separated")
  ap.add_argument("--timeout_s", type=float, default=60.0,
                  help="client timeout per request (a proxy's typical limit)")
  ap.add_argument("--pin", type=int, default=int(len(os.sched_getaffinity(0)) >= 2),
                  help="1: server on core 0, load generator and test server on core 1")
  ap.add_argument("--passthrough", type=int, default=1,
                  help="1: also run the same requests as pass-through calls, side by side")
  args = ap.parse_args()
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench_server_"))
  workdir = args.workdir
  if not workdir:
    workdir = tmp / "router"
    print(f"training a router with experiments/configs/test.py into {workdir}", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "experiments.train",
                    "--config=experiments/configs/test.py", f"--workdir={workdir}",
                    "--noevaluate"], check=True, cwd=paths.REPO_ROOT, capture_output=True)
  config = json.loads((pathlib.Path(workdir) / "config.json").read_text())
  catalog = catalog_lib.load_catalog(config.get("catalog_file") or catalog_lib.DEFAULT_POOL_FILE)
  llms = system_lib.select_llms(catalog, config["llms"])
  clients = [int(c) for c in args.clients.split(",")]
  rows = []
  cores = sorted(os.sched_getaffinity(0))
  for backend in args.backends.split(","):
    extra, test_server, latency = [], None, None
    if args.pin:   # children inherit the affinity of the thread that starts them
      os.sched_setaffinity(0, {cores[1]})
    if backend == "testing_server":
      test_server, url = start_test_server(args.latency_s, llms)
      ep = tmp / "endpoints.json"
      ep.write_text(json.dumps({m: [{"base_url": url, "model": m}] for m in llms}))
      extra = ["--config.backend=endpoints", f"--config.endpoints_file={ep}"]
      latency = args.latency_s
    elif backend != "simulator":
      raise SystemExit(f"error: unknown backend {backend!r} (simulator, testing_server)")
    srv = process.RouterProcess([f"--workdir={workdir}", "--memory_path=none",
                                 f"--max_concurrency={args.max_concurrency}"] + extra
                                + args.server_args.split(), tmp / f"server-{backend}.log")
    try:
      if args.pin:
        os.sched_setaffinity(0, {cores[0]})
      srv.start()
      if args.pin:
        os.sched_setaffinity(0, {cores[1]})
      for c in clients:
        for kind, model in [("routed", "graphplanner")] + (
            [("pass-through", llms[0])] if args.passthrough else []):
          res = asyncio.run(load(srv.url, c, args.requests, model, args.timeout_s))
          row = summarise(res, c, latency, args.max_concurrency)
          row["backend"], row["kind"] = backend, kind
          rows.append(row)
          print(f"{backend} {kind} x{c}: {row['rps']:.1f} req/s, 429: {row['429']}, "
                f"timeouts: {row['timeout']}", file=sys.stderr)
    finally:
      srv.stop()
      if test_server is not None:
        test_server.kill()
        test_server.wait()
  print(f"\nrouter server, {args.requests} requests per client, test-server latency "
        f"{args.latency_s:g} s per call, max_concurrency {args.max_concurrency}, "
        f"{'server on its own core' if args.pin else 'no pinning'}, client timeout "
        f"{args.timeout_s:g} s, server flags: {args.server_args or '(defaults)'}\n")
  print("| backend | kind | clients | answered | 429 | timeouts | req/s | p50 latency (s) | "
        "p99 latency (s) | router overhead per decision p50 / p99 (ms) | router compute per "
        "decision p50 / p99 (ms) | client-seen non-backbone time per request p50 / p99 (ms) | LLM "
        "calls per request | throughput / ideal |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    ratio = f"{r['rps'] / r['ideal']:.2f}" if r["ideal"] else "n/a (no backbone latency)"
    router = (f"{r['over50']:.2f} / {r['over99']:.2f} | {r['work50']:.2f} / {r['work99']:.2f}"
              if r["kind"] == "routed" else "n/a (no decisions) | n/a")
    print(f"| {r['backend']} | {r['kind']} | {r['clients']} | {r['requests']} | {r['429']} "
          f"| {r['timeout']} | {r['rps']:.1f} | {r['p50']:.3f} | {r['p99']:.3f} "
          f"| {router} | {r['rest50']:.1f} / {r['rest99']:.1f} | {r['calls']:.1f} | {ratio} |")


if __name__ == "__main__":
  main()
