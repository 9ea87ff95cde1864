"""Transition padding buckets: bounded waste per size, one compilation per padded size across a run,
a size that grows at once and never shrinks."""
import json
import types

import pytest

from experiments.configs import test as test_config
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import loop as loop_lib
from gp_jax.runs import train as training
from gp_jax.util import buckets as buckets_lib


@pytest.mark.parametrize("devices", [1, 4])
def test_buckets_waste_at_most_a_quarter(devices):
  # Default config: 64 episodes x 10 calls at most, 4 minibatches.
  unit = batch_lib.batch_size_for(1, 1, 4, devices)
  top = batch_lib.batch_size_for(64, 10, 4, devices)
  sizes = batch_lib.padding_buckets(top, unit)
  assert sizes[-1] == top and sizes == sorted(set(sizes))
  assert all(s % unit == 0 for s in sizes)
  for n in range(1, top + 1):
    size = buckets_lib.bucket(n, sizes)
    assert size >= n
    if n > 3 * unit:
      assert (size - n) / size <= batch_lib.MAX_WASTE, (n, size)
    else:
      assert size - n < unit
  assert len(sizes) <= 12   # few shapes, so few compilations
  with pytest.raises(ValueError, match="exceed"):
    buckets_lib.bucket(top + 1, sizes)


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


def test_bucket_size_grows_at_once_and_never_shrinks():
  """The padded size is the bucket of the most transitions so far: it grows as soon as an
  iteration needs more, stays when later iterations need less (a history bucket change included),
  and a resumed run continues from the saved loop state (LoopState.padded_size)."""
  buckets = batch_lib.padding_buckets(640, 32)
  loop = types.SimpleNamespace(buckets=buckets, batch_size=640)
  size, sizes = loop_lib.LoopState().padded_size, []
  for n in (200, 300, 150, 100, 330, 100):
    size = loop_lib._padded_size(loop, size, n)
    sizes.append(size)
  assert sizes == [256, 320, 320, 320, 416, 416]
  assert all(s >= buckets_lib.bucket(n, buckets) for s, n in zip(sizes, (200, 300, 150, 100,
                                                                           330, 100)))
  resumed = loop_lib.LoopState.from_record(loop_lib.LoopState(padded_size=size).record())
  assert loop_lib._padded_size(loop, resumed.padded_size, 100) == 416
  assert loop_lib._padded_size(loop, 0, 100) == buckets_lib.bucket(100, buckets) == 128
  fixed = types.SimpleNamespace(buckets=None, batch_size=640)
  assert loop_lib._padded_size(fixed, 0, 100) == 640
