"""Transition padding buckets: bounded waste per size, one compilation per padded size across a run,
sizes that shrink only when the history reaches a new bucket."""
import json
import types

import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax.graph import history as history_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import train as train_lib
from gp_jax.runs import train as training


@pytest.mark.parametrize("devices", [1, 4])
def test_buckets_waste_at_most_a_quarter(devices):
  # Default config: 64 episodes x 10 calls at most, 4 minibatches.
  unit = batch_lib.batch_size_for(1, 1, 4, devices)
  top = batch_lib.batch_size_for(64, 10, 4, devices)
  sizes = batch_lib.padding_buckets(top, unit)
  assert sizes[-1] == top and sizes == sorted(set(sizes))
  assert all(s % unit == 0 for s in sizes)
  for n in range(1, top + 1):
    size = batch_lib.padded_size(n, sizes)
    assert size >= n
    if n > 3 * unit:
      assert (size - n) / size <= batch_lib.MAX_WASTE, (n, size)
    else:
      assert size - n < unit
  assert len(sizes) <= 12   # few shapes, so few compilations
  with pytest.raises(ValueError, match="exceed"):
    batch_lib.padded_size(top + 1, sizes)


def test_bucketed_run_compiles_once_per_padded_size(tmp_path):
  cfg = test_config.get_config()
  cfg.train.padding = "buckets"
  cfg.train.episodes = 64
  training.train(cfg, tmp_path, verbose=False)
  recs = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert len(recs) == 4
  seen = set()
  for r in recs:
    seen.add(r["padded_transitions"])
    assert r["transitions"] <= r["padded_transitions"]
    # No recompiles beyond the first batch of each padded size (history growth inside its
    # bucket, new parameters, new data: all the same program).
    assert r["update_compiles"] == len(seen), recs
  assert max(seen) < batch_lib.batch_size_for(16, 10, 2)   # the fixed size
  sizes = [r["padded_transitions"] for r in recs]
  assert sizes == sorted(sizes)   # one history bucket: the size never shrinks


def test_bucket_size_shrinks_only_with_a_new_history_bucket():
  """The padded size follows the most transitions so far, grows at once, and shrinks only when
  the history rows reach a new bucket (a compilation then happens anyway)."""
  buckets = batch_lib.padding_buckets(640, 32)
  hist = history_lib.HistoryMemory(4, 3, capacity=100_000, headroom=640)
  loop = types.SimpleNamespace(buckets=buckets, batch_size=640, history=hist,
                               settings=types.SimpleNamespace(history="transductive"))
  meta = {}

  def step(n, rows_added=0):
    hist.add(np.zeros((rows_added, 4), np.float32), np.zeros(rows_added, np.int32))
    return train_lib._padded_size(loop, meta, n)
  assert step(200, 200) == 256
  assert step(300, 300) == 320      # grows at once
  assert step(150, 150) == 320      # no shrink inside the history bucket (4096 rows)
  assert step(100, 3500) == 320     # new bucket (8192 rows): the most so far, 300, needs 320
  assert step(330) == 416
  meta_copy = dict(meta)            # a resumed run continues from the saved meta
  assert step(100) == 416
  assert train_lib._padded_size(loop, dict(meta_copy), 100) == 416
  fixed = types.SimpleNamespace(buckets=None, batch_size=640, history=hist, settings=loop.settings)
  assert train_lib._padded_size(fixed, {}, 100) == 640
