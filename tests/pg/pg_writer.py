"""A writer process for the PostgreSQL store tests: for i in 0..N-1 it appends a route record
and adds one feedback, printing one line per acknowledged write ("route RID SEQ",
"feedback RID SEQ"), flushed at once, so the test knows what was acknowledged before it kills it.

  python tests/pg/pg_writer.py URL NAMESPACE PREFIX N [HOLD_S]

HOLD_S: each write keeps its transaction open for 0 to 3 x HOLD_S (varying from write to write)
after its seq is taken: the window in which a later seq could commit first if seqs were not
committed in order.
"""
from __future__ import annotations

import sys

import numpy as np

from gp_jax.serving.state import postgres
from gp_jax.serving.state import store_api

ROW_DIM, NUM_HUBS = 6, 4


def main(url: str, namespace: str, prefix: str, n: int, hold_s: float = 0.0) -> None:
  store = postgres.PostgresStore(url, row_dim=ROW_DIM, num_hubs=NUM_HUBS, namespace=namespace)
  print("ready", flush=True)
  for i in range(n):
    store._hold_before_commit_s = hold_s * ((i + len(prefix)) % 4)
    rid = f"{prefix}-{i}"
    seq = store.append_route({"type": "route", "id": rid, "query": f"q {i}"})
    print(f"route {rid} {seq}", flush=True)
    rows = np.full((1 + i % 3, ROW_DIM), i, np.float32)
    hubs = np.arange(len(rows), dtype=np.int32) % NUM_HUBS
    fb = store.add_feedback(store_api.Feedback(0, rid, None, 0.5, rows, hubs))
    print(f"feedback {rid} {fb.seq}", flush=True)
  store.close()


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]),
       float(sys.argv[5]) if len(sys.argv) > 5 else 0.0)
