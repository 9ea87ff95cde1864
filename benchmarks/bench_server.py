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

Beside LiteLLM's proxy (--litellm=auto, or the python of a venv with litellm[proxy]): the same
pass-through requests also go through LiteLLM's proxy (scripts/setup_litellm.sh installs it in its
own venv), started from a generated config that forwards each of the test server's model names to
the test server as an OpenAI-compatible api_base. It runs with no master key (no auth, as the
router server here; LiteLLM needs general_settings.dangerously_permit_weak_or_unset_master_key
for that), no database (no spend logs kept), no retries and one worker, on the same core as the
router server (core 0 with --pin); both servers are up for the whole backend, one under load at
a time. LiteLLM runs on the test server only (not the simulator).

Open loop (--modes=lockstep,open-loop): besides the lockstep clients above (each sends its next
request when its last one is answered), requests arrive as a Poisson process at --open_loop_load
(0.8) of the capacity, the ideal throughput above: min(clients, max_concurrency) / (calls per
request x latency), calls per request taken from the warm-up requests (1 for pass-through). In
open loop, "clients" is the concurrency cap: at most that many requests are in flight from the
load generator at once; an arrival that finds the cap full waits in the load generator, and its
latency counts from its scheduled arrival time, so a server that falls behind shows as latency,
not as fewer arrivals (the client timeout counts from when the request is sent); at 1 client,
for one, the latency includes queueing behind the one request in flight. Each open-loop run
sends clients x --requests requests, as lockstep does. LiteLLM gets the same rate and the
same arrival times as our pass-through (the same seed per client count). Open loop runs on the
test server only (the capacity needs its latency).

When LiteLLM or open loop is asked for (or --json), a second table follows: one row per (mode,
clients, target), target ours-routed / ours-pass-through / litellm-pass-through, on the test
server: answered, offered and achieved requests/s, p50/p99 end-to-end latency, for ours-routed
the router overhead per decision p50/p99, for pass-through the non-backbone time p50/p99 (end-to-
end latency minus the test server's injected latency, one call; the same measure for ours and
LiteLLM, which reports no backbone time), and the errors (429 / timeouts / other). --json PATH
writes those rows and the settings as JSON.

  python benchmarks/bench_server.py [--workdir workdirs/alpha0.5] [--latency_s 0.2] \
      [--clients 1,16,64,256] [--max_concurrency 64] [--server_args=--max_queue=128] \
      [--litellm=auto] [--modes=lockstep,open-loop] [--json=bench_server.json] [--quick]

--quick is --clients=1,16,64 --requests=4 --backends=testing_server (flags given still win).

Without --workdir a router is trained with experiments/configs/test.py into a temporary folder.
"""
import argparse
import asyncio
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

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


def free_port() -> int:
  """A TCP port on 127.0.0.1 that was free a moment ago (for a child that takes no port 0)."""
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def litellm_config(models: list[str], api_base: str, timeout_s: float) -> dict:
  """LiteLLM proxy config that forwards each model name to one OpenAI-compatible server.

  Args:
    models: the model names the server answers; each is served under the same name.
    api_base: the server's base URL, ending with /v1.
    timeout_s: LiteLLM's own timeout per backend call.

  Returns:
    The config as a dict. JSON is YAML, so `json.dumps` of it is a valid config.yaml. It sets
    no master_key and no database_url: the proxy serves without auth (like the router server
    on loopback without --api_keys_file) and keeps no spend logs. LiteLLM refuses to start
    without a master key unless dangerously_permit_weak_or_unset_master_key is set.
  """
  return {
      "model_list": [{"model_name": m,
                      "litellm_params": {"model": f"openai/{m}", "api_base": api_base,
                                         "api_key": "not-checked"}} for m in models],
      "litellm_settings": {"num_retries": 0, "request_timeout": timeout_s},
      "general_settings": {"dangerously_permit_weak_or_unset_master_key": True},
  }


def litellm_env(base: dict[str, str]) -> dict[str, str]:
  """The LiteLLM proxy's environment: `base` without this project's PYTHONPATH and without the
  variables that would turn on auth or a database; no price table fetched at start."""
  drop = ("PYTHONPATH", "LITELLM_MASTER_KEY", "DATABASE_URL")
  env = {k: v for k, v in base.items() if k not in drop}
  env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
  return env


class LiteLLMProxy:
  """LiteLLM's proxy (`python -m litellm.proxy.proxy_cli`) in its own process group.

  Args:
    python: the python of a venv with litellm[proxy] (scripts/setup_litellm.sh).
    config: the proxy config (litellm_config).
    folder: where the config file and the proxy's log go.
    start_timeout_s: how long to wait for /health/liveliness to answer 200.
  """

  def __init__(self, python: str, config: dict, folder: pathlib.Path, *,
               start_timeout_s: float = 180.0):
    self.python, self.config, self.folder = python, config, pathlib.Path(folder)
    self.start_timeout_s = start_timeout_s
    self.proc: subprocess.Popen | None = None
    self.url = ""   # http://HOST:PORT (no /v1)

  def start(self) -> "LiteLLMProxy":
    cfg, log_path = self.folder / "litellm.yaml", self.folder / "litellm.log"
    cfg.write_text(json.dumps(self.config, indent=1))
    port = free_port()
    cmd = [self.python, "-m", "litellm.proxy.proxy_cli", "--config", str(cfg),
           "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    with open(log_path, "w") as log:
      self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=self.folder,
                                   env=litellm_env(dict(os.environ)), start_new_session=True)
    self.url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while time.monotonic() - t0 < self.start_timeout_s:
      if self.proc.poll() is not None:
        raise SystemExit(f"error: the LiteLLM proxy exited with {self.proc.returncode} "
                         f"(log: {log_path}):\n{log_path.read_text(errors='replace')[-3000:]}")
      try:
        with urllib.request.urlopen(self.url + "/health/liveliness", timeout=5) as resp:
          if resp.status == 200:
            return self
      except OSError:
        pass
      time.sleep(0.5)
    self.stop()
    raise SystemExit(f"error: the LiteLLM proxy did not answer /health/liveliness within "
                     f"{self.start_timeout_s:.0f} s (log: {log_path})")

  def stop(self) -> None:
    if self.proc is None or self.proc.poll() is not None:
      return
    os.killpg(self.proc.pid, signal.SIGTERM)
    try:
      self.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      os.killpg(self.proc.pid, signal.SIGKILL)
      self.proc.wait(timeout=30)


def setup_litellm(flag: str) -> str:
  """The LiteLLM venv's python: `flag` itself, or with `auto` what scripts/setup_litellm.sh
  prints (it installs the venv the first time)."""
  if flag != "auto":
    return flag
  out = subprocess.run(["bash", str(paths.REPO_ROOT / "scripts" / "setup_litellm.sh")],
                       check=True, stdout=subprocess.PIPE, text=True).stdout
  return out.strip().splitlines()[-1]


def ideal_rps(clients: int, slots: int, calls: float, latency_s: float) -> float:
  """Throughput that backbone latency and concurrency allow: min(clients, slots) workflows at
  once, each taking calls x latency_s."""
  return min(clients, slots) / (calls * latency_s)


def poisson_schedule(rate: float, n: int, seed: int) -> np.ndarray:
  """Arrival times (seconds after the start) of `n` requests of a Poisson process.

  Args:
    rate: mean arrivals per second (> 0).
    n: how many arrivals.
    seed: the draw's seed; the same seed gives the same times.

  Returns:
    Increasing times, shape [n]: cumulative exponential gaps of mean 1 / rate.
  """
  if rate <= 0:
    raise ValueError(f"rate must be > 0, got {rate}")
  return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n))


def non_backbone_ms(e2e_s, latency_s: float, calls: float = 1.0) -> np.ndarray:
  """End-to-end latency less the test server's injected latency (calls x latency_s), in ms."""
  return (np.asarray(e2e_s, dtype=float) - calls * latency_s) * 1e3


def _question(c: int, r: int) -> dict:
  return {"role": "user", "content": f"Question {c}-{r}: how many moons?"}


async def _post(session, url: str, model: str, message: dict, t0: float, out: list,
                status: dict) -> None:
  """Sends one chat request; appends its facts to `out` if answered, else counts the refusal.
  The latency counts from `t0` (perf_counter). The router's answers carry its timing; other
  answers (a pass-through proxy's) record one call."""
  body = {"model": model, "messages": [message]}
  try:
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
      data = await resp.json(content_type=None)
      code = resp.status
  except asyncio.TimeoutError:
    status["timeout"] += 1
    return
  except aiohttp.ClientError as e:
    status["other"] += 1
    print(f"request failed: {e!r}", file=sys.stderr)
    return
  if code == 429:
    status["429"] += 1
    return
  if code != 200:
    status["other"] += 1
    print(f"request failed with {code}: {data}", file=sys.stderr)
    return
  rec = dict(e2e=time.perf_counter() - t0, calls=1)
  ext = data.get("graphplanner") if isinstance(data, dict) else None
  if ext:
    rec.update(calls=len(ext["route"]), **ext["timing"])
  out.append(rec)


def _new_status() -> dict:
  return {"429": 0, "timeout": 0, "other": 0}


async def _warm_up(session, url: str, requests: int, model: str) -> list[dict]:
  """`requests` sequential requests (connections, first-call paths); returns their facts."""
  out = []
  for r in range(requests):
    await _post(session, url, model, _question(-1, r), time.perf_counter(), out, _new_status())
  return out


def _session(timeout_s: float) -> aiohttp.ClientSession:
  return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                               timeout=aiohttp.ClientTimeout(total=timeout_s))


async def load(url: str, clients: int, requests: int, model: str, timeout_s: float) -> dict:
  """Runs `clients` clients of `requests` sequential requests each to `model` (the router or a
  backbone by name); returns per-request facts of the answered ones and the refusal counts."""
  out, status = [], _new_status()

  async def client(session, c):
    for r in range(requests):
      await _post(session, url, model, _question(c, r), time.perf_counter(), out, status)

  async with _session(timeout_s) as session:
    await _warm_up(session, url, requests, model)
    t0 = time.perf_counter()
    await asyncio.gather(*[client(session, c) for c in range(clients)])
    wall = time.perf_counter() - t0
  return dict(records=out, wall=wall, status=status)


async def open_loop(url: str, clients: int, requests: int, model: str, timeout_s: float, *,
                    latency_s: float, slots: int, load_share: float, seed: int) -> dict:
  """Open-loop load: clients x requests requests arriving as a Poisson process, at most
  `clients` in flight (see the module docstring).

  Args:
    url: the server (no /v1).
    clients: the concurrency cap; with `slots` and the calls per request it sets the capacity.
    requests: requests per client (the run sends clients x requests).
    model: the router or a backbone by name.
    timeout_s: client timeout per request, from when it is sent.
    latency_s: the test server's latency per call.
    slots: the router server's max_concurrency.
    load_share: arrival rate as a share of the capacity (ideal_rps).
    seed: the arrival schedule's seed.

  Returns:
    records and status as `load`, wall (first scheduled arrival to the last answer) and offered
    (the arrival rate, requests/s).
  """
  out, status = [], _new_status()
  async with _session(timeout_s) as session:
    warm = await _warm_up(session, url, requests, model)
    calls = float(np.mean([x["calls"] for x in warm])) if warm else 1.0
    rate = load_share * ideal_rps(clients, slots, calls, latency_s)
    arrivals = poisson_schedule(rate, clients * requests, seed)
    cap = asyncio.Semaphore(clients)
    t0 = time.perf_counter()

    async def arrive(i, at):
      await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
      async with cap:
        await _post(session, url, model, _question(i % clients, i // clients), t0 + at, out,
                    status)

    await asyncio.gather(*[arrive(i, at) for i, at in enumerate(arrivals)])
    wall = time.perf_counter() - t0
  return dict(records=out, wall=wall, status=status, offered=rate)


def per_decision(records: list[dict], key: str) -> np.ndarray:
  """records' `key` (seconds, from the router's timing) divided by their decisions."""
  return np.array([x[key] / max(1, x["decisions"]) for x in records])


def summarise(res: dict, clients: int, latency_s: float | None, slots: int) -> dict:
  r = res["records"]
  if not r:
    return dict(clients=clients, requests=0, rps=0.0, p50=np.nan, p99=np.nan, over50=np.nan,
                over99=np.nan, work50=np.nan, work99=np.nan, calls=np.nan, ideal=None,
                rest50=np.nan, rest99=np.nan, **res["status"])
  e2e = np.array([x["e2e"] for x in r])
  per_dec, work = per_decision(r, "router_s"), per_decision(r, "compute_s")
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
    row["ideal"] = ideal_rps(clients, slots, calls, latency_s)
  return row


def _p50_p99(values, scale: float = 1.0) -> tuple[float, float]:
  return (float(np.percentile(values, 50)) * scale, float(np.percentile(values, 99)) * scale)


def compare_row(mode: str, clients: int, target: str, res: dict, latency_s: float) -> dict:
  """One row of the comparison table from a `load` or `open_loop` result.

  Args:
    mode: lockstep or open-loop.
    clients: the client count (lockstep) or concurrency cap (open loop).
    target: ours-routed, ours-pass-through or litellm-pass-through.
    res: the load's result.
    latency_s: the test server's latency per call.

  Returns:
    JSON-ready fields; None where a value does not apply (overhead for pass-through, the
    non-backbone time for routed, offered_rps in lockstep) or nothing was answered.
  """
  r = res["records"]
  row = dict(mode=mode, clients=clients, target=target, answered=len(r),
             offered_rps=res.get("offered"), rps=len(r) / res["wall"] if res["wall"] else 0.0,
             p50_s=None, p99_s=None, overhead_p50_ms=None, overhead_p99_ms=None,
             non_backbone_p50_ms=None, non_backbone_p99_ms=None,
             errors_429=res["status"]["429"], errors_timeout=res["status"]["timeout"],
             errors_other=res["status"]["other"])
  if not r:
    return row
  row["p50_s"], row["p99_s"] = _p50_p99([x["e2e"] for x in r])
  if target == "ours-routed":
    row["overhead_p50_ms"], row["overhead_p99_ms"] = _p50_p99(per_decision(r, "router_s"), 1e3)
  else:
    nb = non_backbone_ms([x["e2e"] for x in r], latency_s)
    row["non_backbone_p50_ms"], row["non_backbone_p99_ms"] = _p50_p99(nb)
  return row


def _cell(value, fmt: str, absent: str = "n/a") -> str:
  return absent if value is None else format(value, fmt)


def _pair(a, b, fmt: str) -> str:
  return "n/a" if a is None else f"{a:{fmt}} / {b:{fmt}}"


def format_compare_table(rows: list[dict]) -> str:
  """The comparison rows as a markdown table (one line per row, header first)."""
  lines = ["| mode | clients | target | answered | offered req/s | req/s | p50 latency (s) | "
           "p99 latency (s) | router overhead per decision p50 / p99 (ms) | non-backbone time "
           "per request p50 / p99 (ms) | 429 / timeouts / other |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['mode']} | {r['clients']} | {r['target']} | {r['answered']} "
        f"| {_cell(r['offered_rps'], '.1f')} | {r['rps']:.1f} | {_cell(r['p50_s'], '.3f')} "
        f"| {_cell(r['p99_s'], '.3f')} "
        f"| {_pair(r['overhead_p50_ms'], r['overhead_p99_ms'], '.2f')} "
        f"| {_pair(r['non_backbone_p50_ms'], r['non_backbone_p99_ms'], '.1f')} "
        f"| {r['errors_429']} / {r['errors_timeout']} / {r['errors_other']} |")
  return "\n".join(lines)


def compare_json(rows: list[dict], settings: dict) -> str:
  """The comparison rows and the run's settings as JSON text."""
  return json.dumps({"settings": settings, "rows": rows}, indent=1, allow_nan=False)


MODES = ("lockstep", "open-loop")
QUICK = dict(clients="1,16,64", requests=4, backends="testing_server")   # --quick's defaults


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command line; --quick puts QUICK's values in as defaults, so flags given still win.
  args.modes comes back as a list."""
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
  ap.add_argument("--litellm", default="",
                  help="python of a venv with litellm[proxy], or 'auto' (scripts/setup_litellm.sh):"
                       " also send the pass-through requests through LiteLLM's proxy")
  ap.add_argument("--modes", default="lockstep",
                  help="comma-separated: lockstep, open-loop (Poisson arrivals, test server only)")
  ap.add_argument("--open_loop_load", type=float, default=0.8,
                  help="open-loop arrival rate as a share of the ideal throughput")
  ap.add_argument("--seed", type=int, default=0, help="seed of the open-loop arrival times")
  ap.add_argument("--json", default="", help="write the comparison table's rows here as JSON")
  ap.add_argument("--quick", action="store_true", help=f"a smaller run: {QUICK}")
  if ap.parse_known_args(argv)[0].quick:
    ap.set_defaults(**QUICK)
  args = ap.parse_args(argv)
  modes = args.modes.split(",")
  if any(m not in MODES for m in modes):
    raise SystemExit(f"error: --modes takes {', '.join(MODES)}, got {args.modes!r}")
  args.modes = modes
  return args


def main():
  t_start = time.perf_counter()
  args = parse_args()
  modes = args.modes
  litellm_python = setup_litellm(args.litellm) if args.litellm else ""
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
  rows, compared = [], []
  cores = sorted(os.sched_getaffinity(0))
  for backend in args.backends.split(","):
    extra, test_server, latency, proxy = [], None, None, None
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
      if litellm_python and backend == "testing_server":
        proxy = LiteLLMProxy(litellm_python, litellm_config(llms, url, args.timeout_s),
                             tmp).start()
      if args.pin:
        os.sched_setaffinity(0, {cores[1]})
      targets = [("ours-routed", srv.url, "graphplanner")]
      if args.passthrough:
        targets.append(("ours-pass-through", srv.url, llms[0]))
      if proxy is not None:
        targets.append(("litellm-pass-through", proxy.url, llms[0]))
      for c in clients:
        for mode in modes if backend == "testing_server" else ["lockstep"]:
          for target, target_url, model in targets:
            t_run = time.perf_counter()
            if mode == "lockstep":
              res = asyncio.run(load(target_url, c, args.requests, model, args.timeout_s))
            else:
              res = asyncio.run(open_loop(target_url, c, args.requests, model, args.timeout_s,
                                          latency_s=args.latency_s, slots=args.max_concurrency,
                                          load_share=args.open_loop_load, seed=args.seed + c))
            if mode == "lockstep" and target.startswith("ours-"):
              row = summarise(res, c, latency, args.max_concurrency)
              row["backend"] = backend
              row["kind"] = "routed" if target == "ours-routed" else "pass-through"
              rows.append(row)
            if backend == "testing_server":
              compared.append(compare_row(mode, c, target, res, args.latency_s))
            print(f"{backend} {mode} {target} x{c}: {len(res['records'])} answered, "
                  f"{len(res['records']) / res['wall']:.1f} req/s, 429: {res['status']['429']}, "
                  f"timeouts: {res['status']['timeout']}, other: {res['status']['other']} "
                  f"({time.perf_counter() - t_run:.0f} s with warm-up)", file=sys.stderr)
    finally:
      if proxy is not None:
        proxy.stop()
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
  if litellm_python or "open-loop" in modes or args.json:
    settings = dict(requests=args.requests, latency_s=args.latency_s,
                    max_concurrency=args.max_concurrency, pin=bool(args.pin),
                    timeout_s=args.timeout_s, server_args=args.server_args,
                    open_loop_load=args.open_loop_load, seed=args.seed, modes=modes,
                    litellm=litellm_python or None)
    print(f"\non the test server ({args.latency_s:g} s per call): ours and LiteLLM's proxy"
          f"{' (same core)' if args.pin else ''}; open loop at {args.open_loop_load:g} of the "
          f"ideal throughput\n")
    print(format_compare_table(compared))
    if args.json:
      pathlib.Path(args.json).write_text(compare_json(compared, settings) + "\n")
      print(f"\nwrote {args.json}", file=sys.stderr)
  print(f"bench_server: {time.perf_counter() - t_start:.0f} s in all", file=sys.stderr)


if __name__ == "__main__":
  main()
