"""One process of tests/test_distributed.py: trains a 2-iteration test config as process `rank`
of `n` joined by jax.distributed (n = 1: alone), in `workdir`."""
import sys

import jax

from experiments.configs import test as test_config
from gp_jax.runs import train as training


def config(port: int, n: int, rank: int):
  cfg = test_config.get_config()
  cfg.train.episodes = 32
  if n > 1:
    cfg.parallel.distributed = True
    cfg.parallel.coordinator = f"localhost:{port}"
    cfg.parallel.num_processes = n
    cfg.parallel.process_id = rank
  return cfg


if __name__ == "__main__":
  port, n, rank, workdir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
  training.train(config(port, n, rank), workdir, verbose=False)
  print(f"DONE process {jax.process_index()} of {jax.process_count()}, "
        f"{len(jax.local_devices())} of {len(jax.devices())} devices")
