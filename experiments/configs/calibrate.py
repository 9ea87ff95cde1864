"""Calibration of the v2 world to the paper's fit targets (gp_jax/sim/calibration.py).

  --config=experiments/configs/calibrate.py        the CPU calibration (minutes)
  --config=experiments/configs/calibrate.py:test   CI size (a few seconds)
"""
import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg not in ("", "test"):
    raise ValueError(f"unknown calibrate config variant {arg!r}; use '' or 'test'")
  c = ml_collections.ConfigDict()
  c.seed = 0                 # the simulated queries (common random numbers for every evaluation)
  c.llms = "train"           # the paper's Phase 2 pool: the 9 LLMs not held out
  c.n_train = 600            # queries the stand-in routers learn their task -> LLM table on
  c.n_test = 600             # queries the stand-ins are scored on
  c.n_unseen = 300           # held-out-task queries (reported, not fitted)
  c.passes = 6               # coordinate-search passes over every parameter
  c.initial_step = 0.125     # first step, as a fraction of each parameter's range
  c.min_step = 0.01          # stop once the step halves below this
  c.fit = "all"              # "all" or a comma list of parameter names (calibration.parameters)
  c.world = ml_collections.ConfigDict()   # the v2 mechanisms, not fitted (gp_jax/sim/world.py)
  c.world.step_cue_sd = 0.7
  c.world.clusters_per_domain = 6
  c.world.cluster_offset_sd = 0.8
  if arg == "test":
    c.n_train, c.n_test, c.n_unseen = 60, 60, 30
    c.passes = 1
    c.fit = "gamma,split_penalty,summary_shift,complexity_tilt"
  return c
