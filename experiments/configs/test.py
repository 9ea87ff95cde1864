"""CPU-sized config for tests: a few iterations on a small simulated pool."""
from experiments.configs import default


def get_config():
  c = default.get_config()
  c.llms = "qwen2.5-7b-instruct,llama-3.1-8b-instruct,llama3-chatqa-1.5-70b"
  c.data.n_train = 48
  c.data.n_test = 24
  c.text.dim = 64
  c.model.mem_proj = 16
  c.model.history_capacity = 400
  c.train.episodes = 48
  c.train.episodes_per_iter = 16
  c.train.parallel = 16
  c.train.checkpoint_every = 1
  c.ppo.num_minibatches = 2
  c.ppo.entropy_stop = 0.0
  return c
