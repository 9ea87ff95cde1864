"""Training cost of the adaptive memory, side by side with today's training, in one process.

  python -m benchmarks.bench_memory_training --episodes=640 --repeats=2

Trains, alternating (today, new, today, new, ...), the test-size config (experiments/configs/
test.py, with --n_train training queries) twice per repeat: "today" = row layout 1 on a fixed
pool (model.history_capacity = --capacity), "new" = row layout 2 with train.pool_perturb on and a
sliding-window history of --window rows; prints each run's training wall time (compilation
included, a fresh workdir each) and the ratio new / today of the summed times.
"""
import argparse
import tempfile
import time

from experiments.configs import test as test_config
from gp_jax.runs import train as training


def config(new: bool, a):
  c = test_config.get_config()
  c.data.n_train = a.n_train
  c.train.episodes, c.train.episodes_per_iter, c.train.parallel = a.episodes, 64, 32
  c.train.checkpoint_every = 1000
  c.model.row_layout = 2 if new else 1
  c.model.history_capacity = a.window if new else a.capacity
  c.train.pool_perturb.enabled = new
  return c


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--episodes", type=int, default=640)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--n_train", type=int, default=200)
  p.add_argument("--capacity", type=int, default=4000)
  p.add_argument("--window", type=int, default=1000)
  a = p.parse_args()
  if a.episodes < 64 or a.repeats < 1:
    raise SystemExit("error: need --episodes >= 64 and --repeats >= 1")
  total = {False: 0.0, True: 0.0}
  for r in range(a.repeats):
    for new in (False, True):
      with tempfile.TemporaryDirectory() as wd:
        t0 = time.time()
        training.train(config(new, a), wd, verbose=False)
        dt = time.time() - t0
      total[new] += dt
      print(f"repeat {r} {'new  ' if new else 'today'}: {dt:.1f} s", flush=True)
  print(f"today {total[False]:.1f} s, new {total[True]:.1f} s, ratio new / today "
        f"{total[True] / total[False]:.2f} ({a.repeats} x {a.episodes} episodes each)")


if __name__ == "__main__":
  main()
