"""Writes a router server's route log as LLMRouter routing rows (one per LLM call), and the other
files LLMRouter's routers train on.

  python -m experiments.export_routes --route_log=workdirs/alpha0.5/served/routes.jsonl --out=routes.jsonl
  python -m experiments.export_routes --url=http://127.0.0.1:8080 --out=routes.csv
  python -m experiments.export_routes --route_log=.../routes.jsonl --out=routes.jsonl \
      --embeddings=query_embeddings.npy --llm_data=llms.json

Columns: task_name, query, ground_truth, metric, model_name, response, performance, token_num,
embedding_id. performance is the request's feedback score; requests without feedback are left
out unless --include_unscored (performance then null). embedding_id numbers the distinct query
texts 0..N-1 in the order they are first seen (rows of one query share it).

--embeddings=PATH.npy writes the query embeddings as a float32 matrix [N, d] whose row i embeds
the query of embedding_id i, made by a gp_jax text encoder (--encoder): "hashing" (the default,
as the server's default config.text.encoder; --encoder_dim wide, 384 like its config.text.dim),
"minilm" (all-MiniLM-L6-v2, 384 wide; its weights come with scripts/env.sh) or "vllm_embed" (an
OpenAI-compatible /v1/embeddings server: --encoder_url, --encoder_model). LLMRouter loads
embeddings from a torch .pt file: `scripts/llmrouter_convert.py PATH.npy PATH.pt`, run with the
LLMRouter venv's python (scripts/setup_llmrouter.sh), converts it. --llm_data=PATH.json writes
LLMRouter's LLM descriptions of the LLMs in the rows, from the LLM catalog (--llm_catalog); its
hybrid router needs them (gp_jax/serving/state/llmrouter_export.py says which router reads what).

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
from gp_jax import files
from gp_jax.llm import catalog as catalog_lib
from gp_jax.serving.state import llmrouter_export
from gp_jax.serving.state import route_log as route_log_lib
from gp_jax.text import encoder as encoder_lib

_LOG = flags.DEFINE_string("route_log", "", "Route log (JSONL) written by serve_router.")
_URL = flags.DEFINE_string("url", "", "Or a running server's base URL (reads /v1/routes).")
_OUT = flags.DEFINE_string("out", "routes.jsonl", "Output file (.jsonl, or .csv).")
_ALL = flags.DEFINE_bool("include_unscored", False, "Also write requests without feedback.")
_EMB = flags.DEFINE_string("embeddings", "", "Also write the query embeddings here (.npy, float32 "
                           "[N, d], row i = embedding_id i).")
_ENCODER = flags.DEFINE_string("encoder", "hashing", "Text encoder of --embeddings: hashing, "
                               "minilm or vllm_embed.")
_DIM = flags.DEFINE_integer("encoder_dim", 384, "Width of the hashing encoder.")
_ENC_URL = flags.DEFINE_string("encoder_url", "", "vllm_embed: the server's base URL (.../v1).")
_ENC_MODEL = flags.DEFINE_string("encoder_model", "", "vllm_embed: the embedding model's name.")
_LLM_DATA = flags.DEFINE_string("llm_data", "", "Also write LLMRouter's LLM descriptions here "
                                "(.json).")
_CATALOG = flags.DEFINE_string("llm_catalog", str(catalog_lib.DEFAULT_POOL_FILE),
                               "LLM catalog that --llm_data describes the LLMs from.")
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


def _encoder() -> encoder_lib.TextEncoder:
  """The text encoder that --encoder names."""
  if _ENCODER.value == "vllm_embed":
    if not _ENC_URL.value or not _ENC_MODEL.value:
      raise errors.ConfigError("--encoder=vllm_embed needs --encoder_url and --encoder_model")
    return encoder_lib.make_encoder("vllm_embed", base_url=_ENC_URL.value, model=_ENC_MODEL.value)
  return encoder_lib.make_encoder(_ENCODER.value, dim=_DIM.value)


@common.user_errors_exit_2
def main(argv):
  del argv
  if bool(_LOG.value) == bool(_URL.value):
    raise errors.ConfigError("give exactly one of --route_log and --url")
  common.check_output_file(_OUT.value, "out")
  if _EMB.value:
    common.check_output_file(_EMB.value, "embeddings", ".npy")
  if _LLM_DATA.value:
    common.check_output_file(_LLM_DATA.value, "llm_data", ".json")
  encoder = _encoder() if _EMB.value else None
  catalog = catalog_lib.load_catalog(_CATALOG.value) if _LLM_DATA.value else None
  if _URL.value:
    records = _from_server(_URL.value)
  else:
    try:
      records = list(route_log_lib.read_log(_LOG.value))
    except FileNotFoundError:
      raise errors.DataError(f"{_LOG.value}: route log not found") from None
  n_req = sum(r["type"] == "route" for r in records)
  rows, queries = llmrouter_export.with_embedding_ids(
      llmrouter_export.llmrouter_rows(records, scored_only=not _ALL.value))
  llms = (llmrouter_export.llm_data(catalog, (r["model_name"] for r in rows), _CATALOG.value)
          if catalog is not None else None)
  if encoder is not None:
    matrix = llmrouter_export.embed(queries, encoder)
    llmrouter_export.write_embeddings(_EMB.value, matrix)
    print(f"{len(queries)} query embeddings [{matrix.shape[0]}, {matrix.shape[1]}] "
          f"({encoder.name}) -> {_EMB.value}", file=sys.stderr)
  if llms is not None:
    files.write_json(_LLM_DATA.value, llms, "the LLM descriptions", indent=2, separators=(",", ": "))
    print(f"{len(llms)} LLM descriptions -> {_LLM_DATA.value}", file=sys.stderr)
  n = llmrouter_export.write_rows(_OUT.value, rows, llmrouter_export.FIELDS)
  print(f"{n} rows ({len(queries)} distinct queries) from {n_req} served requests -> "
        f"{_OUT.value}", file=sys.stderr)


if __name__ == "__main__":
  common.run(main)
