"""Where the router's compute runs: on the event loop, or in the compute thread (one hop there
and back per job).

A hop costs the loop about as much work as a small job, and its answer waits behind the other
requests' work before the loop takes it back; a large job on the loop would stall every request
in flight. So the placement is chosen at start from what the jobs cost here: the batched policy
call by its largest batch's time (`policy_thread`), a call's memory row by the text encoder.
"""
from __future__ import annotations

import time

import numpy as np

POLICY_THREADS = ("auto", "loop", "thread")   # where batched policy calls run (RouterSession)
# "auto" runs the policy calls on the event loop when the largest batch's call takes at most
# this long: a hop to the compute thread and back costs the loop about as much work, and every
# decision then waited for the loop to take the answer back behind the other requests' work
# (docs/lab/2026-12-07-recut-overhead-look.md).
INLINE_POLICY_S = 0.002
# A call's memory row (its texts encoded) and the next observation are made on the loop with
# these text encoders (config.text.encoder): the hashing encoder takes about 0.1-0.5 ms for two
# texts of 260-1,040 characters here. MiniLM's forward pass and an embedding server's HTTP round
# trip would stall the loop: their rows are made in the compute thread.
LOOP_ENCODERS = ("hashing",)


def time_largest_call(batcher, obs: dict, q_emb) -> float:
  """The median seconds of 5 policy calls of `batcher`'s largest batch (compiled already)."""
  n = batcher.buckets[-1]
  ids = [batcher._ids([0] * batcher.num_ids)] * n
  times = []
  for _ in range(5):
    t0 = time.perf_counter()
    batcher.act([obs] * n, ids, [q_emb] * n)
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def policy_on_loop(policy_thread: str, largest_call_s: float) -> bool:
  """Whether the batched policy calls run on the loop (policy_thread: one of POLICY_THREADS)."""
  return policy_thread == "loop" or (policy_thread == "auto" and largest_call_s <= INLINE_POLICY_S)


def rows_on_loop(text_encoder: str) -> bool:
  """Whether a call's memory row and the next observation are made on the loop, for the text
  encoder of config.text.encoder."""
  return text_encoder in LOOP_ENCODERS
