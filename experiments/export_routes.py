"""Writes a router server's route log as LLMRouter routing rows (one per LLM call).

  python -m experiments.export_routes --route_log=workdirs/alpha0.5/served/routes.jsonl --out=routes.jsonl
  python -m experiments.export_routes --url=http://127.0.0.1:8080 --out=routes.csv

Columns: task_name, query, ground_truth, metric, model_name, response, performance, token_num.
performance is the request's feedback score; requests without feedback are left out unless
--include_unscored (performance then null).

A server with --api_keys_file answers /v1/routes to an admin key only: give it in the
GP_JAX_API_KEY environment variable (not a flag, so it stays out of the process list).
"""
import json
import os
import sys
import urllib.error
import urllib.request

from absl import flags

from experiments import common
from gp_jax import errors
from gp_jax.runs.serving import store

_LOG = flags.DEFINE_string("route_log", "", "Route log (JSONL) written by serve_router.")
_URL = flags.DEFINE_string("url", "", "Or a running server's base URL (reads /v1/routes).")
_OUT = flags.DEFINE_string("out", "routes.jsonl", "Output file (.jsonl, or .csv).")
_ALL = flags.DEFINE_bool("include_unscored", False, "Also write requests without feedback.")
API_KEY_ENV = "GP_JAX_API_KEY"


def _from_server(url: str) -> list[dict]:
  """Every route record the server lists, paged by seq (`after`), so none is skipped."""
  out, after = [], 0
  key = os.environ.get(API_KEY_ENV, "")
  headers = {"Authorization": f"Bearer {key}"} if key else {}
  while True:
    req = urllib.request.Request(f"{url.rstrip('/')}/v1/routes?after={after}&limit=1000",
                                 headers=headers)
    try:
      with urllib.request.urlopen(req, timeout=30) as r:
        page = json.loads(r.read())
    except urllib.error.HTTPError as e:
      if e.code in (401, 403):
        why = {401: "is not a valid key", 403: "is not an admin's"}[e.code] if key else "is unset"
        raise errors.BackendError(f"{url}/v1/routes answered {e.code}: it needs an admin API key "
                                  f"in {API_KEY_ENV}, which {why}") from None
      raise errors.BackendError(f"cannot read {url}/v1/routes: {e}") from None
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
      raise errors.BackendError(f"cannot read {url}/v1/routes: {e}") from None
    if not page["data"]:
      return out
    out += page["data"]
    after = page["last"]


@common.user_errors_exit_2
def main(argv):
  del argv
  if bool(_LOG.value) == bool(_URL.value):
    raise errors.ConfigError("give exactly one of --route_log and --url")
  if _URL.value:
    records = _from_server(_URL.value)
  else:
    try:
      records = list(store.read_log(_LOG.value))
    except FileNotFoundError:
      raise errors.DataError(f"{_LOG.value}: route log not found") from None
  n_req = sum(r["type"] == "route" for r in records)
  n = store.write_rows(_OUT.value, store.llmrouter_rows(records, scored_only=not _ALL.value))
  print(f"{n} rows from {n_req} served requests -> {_OUT.value}", file=sys.stderr)


if __name__ == "__main__":
  common.run(main)
