"""Throughput of OpenAIPool against a local server with a fixed latency L.

64 episodes run at once, each making its calls one after another (as a workflow does). A perfect
client keeps 64 requests open all the time, i.e. 64 / L requests per second; the ratio of the
measured rate to that ideal is printed (target >= 0.90). The server runs as a subprocess so that it
does not share this process's interpreter.

  python benchmarks/bench_pool.py [--latency_s 0.5] [--episodes 64] [--calls 20] [--replicas 1]
"""
import argparse
import asyncio
import os
import subprocess
import sys
import time

from gp_jax import paths
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import openai_pool


def start_server(latency_s: float) -> tuple[subprocess.Popen, str]:
  proc = subprocess.Popen(
      [sys.executable, "-m", "gp_jax.llm.testing_server", "--port", "0", "--latency_s", str(latency_s)],
      stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)})
  line = proc.stdout.readline().strip()
  if not line.startswith("listening on "):
    proc.kill()
    raise SystemExit(f"error: test server did not start: {line!r}")
  return proc, line.split()[-1] + "/v1"


async def run(pool, model: str, episodes: int, calls: int):
  async def episode(i):
    n_ok = 0
    for j in range(calls):
      c = await pool.chat(model, [{"role": "user", "content": f"episode {i} step {j}"}])
      n_ok += c.ok
    return n_ok
  return await asyncio.gather(*[episode(i) for i in range(episodes)])


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--latency_s", type=float, default=0.5)
  ap.add_argument("--episodes", type=int, default=64)
  ap.add_argument("--calls", type=int, default=20, help="sequential calls per episode")
  ap.add_argument("--replicas", type=int, default=1)
  args = ap.parse_args()
  servers = [start_server(args.latency_s) for _ in range(args.replicas)]
  model = "qwen2.5-7b-instruct"
  try:
    pool = openai_pool.OpenAIPool(
        catalog_lib.load_catalog(), {model: [{"base_url": url, "model": "m"} for _, url in servers]},
        max_concurrency=args.episodes, timeout_s=30.0)
    asyncio.run(run(pool, model, args.episodes, 1))  # warm-up: open the connections
    pool = openai_pool.OpenAIPool(
        catalog_lib.load_catalog(), {model: [{"base_url": url, "model": "m"} for _, url in servers]},
        max_concurrency=args.episodes, timeout_s=30.0)
    t0 = time.perf_counter()
    ok = asyncio.run(run(pool, model, args.episodes, args.calls))
    elapsed = time.perf_counter() - t0
  finally:
    for proc, _ in servers:
      proc.terminate()
      proc.wait(10)
  n = args.episodes * args.calls
  rate = n / elapsed
  ideal = args.episodes / args.latency_s
  print(f"episodes={args.episodes} calls/episode={args.calls} latency={args.latency_s:.3f}s "
        f"replicas={args.replicas}")
  print(f"requests={n} ok={sum(ok)} elapsed={elapsed:.2f}s rate={rate:.1f} req/s "
        f"ideal={ideal:.1f} req/s ratio={rate / ideal:.3f}")
  s = pool.stats()
  print(f"mean latency per call={s['latency_s_sum'] / max(s['calls'], 1):.4f}s failed={s['failed']}")


if __name__ == "__main__":
  main()
