"""Damaged SQLite caches (replay, embeddings): one DataError naming the file, never a traceback
and never rows silently lost or recomputed in place of the stored ones."""
import asyncio
import pathlib
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from gp_jax import errors
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import replay
from gp_jax.text import encoder as encoder_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
QWEN = "qwen2.5-7b-instruct"


class EchoPool(base.LLMPool):
  def __init__(self, catalog):
    super().__init__(catalog)
    self.calls = 0

  async def chat(self, model, messages, params=base.SamplingParams()):
    self.calls += 1
    text = messages[-1]["content"] * 20
    return base.Completion(model=model, text=text, input_tokens=5, output_tokens=len(text) // 4,
                           cost_usd=1e-6, latency_s=0.01)


def truncate(path: pathlib.Path, keep: float = 0.5) -> None:
  data = path.read_bytes()
  path.write_bytes(data[:int(len(data) * keep)])


@pytest.fixture
def recorded(tmp_path):
  """A replay file of 200 calls (spread over many pages), closed."""
  catalog = catalog_lib.load_catalog()
  path = tmp_path / "replay.sqlite"
  rec = replay.ReplayPool(EchoPool(catalog), path, "read-write")

  async def record():
    for i in range(200):
      await rec.chat(QWEN, [{"role": "user", "content": f"question {i} " + "x" * 50}])
  asyncio.run(record())
  rec.close()
  con = sqlite3.connect(path)
  con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
  con.close()
  return catalog, path


@pytest.mark.parametrize("mode", ["read-only", "read-write"])
def test_truncated_replay_cache_is_refused_at_open(recorded, mode):
  catalog, path = recorded
  truncate(path)
  with pytest.raises(errors.DataError, match=f"{path}: the replay cache is damaged"):
    replay.ReplayPool(EchoPool(catalog) if mode == "read-write" else None, path, mode,
                      catalog=catalog)


def test_damaged_replay_row_is_an_error_not_a_miss(recorded):
  catalog, path = recorded
  con = sqlite3.connect(path)
  con.execute("UPDATE completions SET completion = '{\"model\": ' WHERE rowid = 7")
  con.commit()
  con.close()
  inner = EchoPool(catalog)
  pool = replay.ReplayPool(inner, path, "read-write")

  async def replay_all():
    for i in range(200):
      await pool.chat(QWEN, [{"role": "user", "content": f"question {i} " + "x" * 50}])
  with pytest.raises(errors.DataError, match="replay cache's row .* is damaged"):
    asyncio.run(replay_all())
  assert inner.calls == 0   # nothing was re-recorded over the damaged row


def _embedding_cache(tmp_path, n=400, dim=64):
  path = tmp_path / "emb.sqlite"
  enc = encoder_lib.make_encoder("hashing", cache_path=path, dim=dim)
  texts = [f"sentence number {i}" for i in range(n)]
  vecs = enc.encode(texts)
  enc._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
  enc._db.close()
  return path, texts, vecs


def test_truncated_embedding_cache_is_refused_at_open(tmp_path):
  path, _, _ = _embedding_cache(tmp_path)
  truncate(path)
  with pytest.raises(errors.DataError, match=f"{path}: the embedding cache is damaged"):
    encoder_lib.make_encoder("hashing", cache_path=path, dim=64)


def test_embedding_row_of_the_wrong_size_is_an_error(tmp_path):
  path, texts, vecs = _embedding_cache(tmp_path)
  con = sqlite3.connect(path)
  con.execute("UPDATE emb SET vec = substr(vec, 1, 100) WHERE key = ?",
              (encoder_lib.CachedEncoder._key(texts[3]),))
  con.commit()
  con.close()
  enc = encoder_lib.make_encoder("hashing", cache_path=path, dim=64)
  np.testing.assert_array_equal(enc.encode(texts[:3]), vecs[:3])
  with pytest.raises(errors.DataError, match="embedding cache's row .* holds 100 bytes, not 256"):
    enc.encode(texts[3:4])


def test_damaged_embedding_cache_on_the_cli_is_one_error_line(tmp_path):
  path, _, _ = _embedding_cache(tmp_path)
  truncate(path)
  out = subprocess.run([sys.executable, "-m", "experiments.train",
                        "--config=experiments/configs/test.py", f"--workdir={tmp_path / 'run'}",
                        f"--config.text.cache={path}"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
  lines = [l for l in out.stderr.splitlines() if l.strip() and not l.startswith("[train]")]  # progress note aside
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
  assert lines[0].startswith(f"error: {path}: the embedding cache is damaged")
