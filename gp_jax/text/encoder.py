"""Text encoders: one interface, a deterministic hashing encoder (default), and an embedding cache.

Every encoder maps a list of strings to a float32 array [n, dim] of L2-normalised rows. Encoders are
host-side (numpy out); the policy network only ever sees the arrays.

Bounds: an encoder reads at most the first MAX_TEXT_CHARS characters of a text (the hashing
encoder itself, and every encoder behind the cache), so a megabyte-long request costs what an
8,192-character one costs; the cache keeps at most MEMORY_ENTRIES vectors in RAM, the least
recently used going first (its SQLite file, when it has one, keeps them all).
"""
from __future__ import annotations

import abc
import collections
import hashlib
import pathlib
import re
import sqlite3
import threading
import zlib
from typing import Callable, Sequence

import numpy as np

from gp_jax import errors
from gp_jax.util import sqlite_wal

# What to do about a damaged embedding cache (the message of its DataError ends with this).
_REMEDY = "restore it from a copy, or move it away (its vectors are then computed again)"

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")

# The characters of a text an encoder reads: the simulator's longest output is about 4,100
# characters, so every text a simulated run encodes is read whole, as before this bound.
MAX_TEXT_CHARS = 8192
# Vectors the cache keeps in RAM (about 1.7 KB each at width 384: some 28 MB when full).
MEMORY_ENTRIES = 16384


def clip(text: str) -> str:
  """The part of `text` an encoder reads: its first MAX_TEXT_CHARS characters."""
  return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS]


class TextEncoder(abc.ABC):
  """Maps texts to L2-normalised float32 vectors of width `dim`."""
  name: str
  dim: int

  @abc.abstractmethod
  def encode(self, texts: Sequence[str]) -> np.ndarray:
    """Returns float32 [len(texts), dim]."""

  def encode_one(self, text: str) -> np.ndarray:
    return self.encode([text])[0]


class HashingEncoder(TextEncoder):
  """Signed feature hashing of words and word bigrams (no weights, no network, deterministic).

  Each lower-cased word w adds sign(w) to bucket(w), each bigram adds half that; buckets and signs
  come from crc32 with a seed, so two processes agree. Texts sharing words have a positive inner
  product, which is all a router needs to tell domains and wording apart.
  """

  def __init__(self, dim: int = 384, seed: int = 0):
    if dim <= 0:
      raise errors.ConfigError(f"hashing encoder dim must be positive, got {dim}")
    self.dim = dim
    self.seed = seed
    self.name = f"hashing-{dim}-{seed}"

  def _features(self, text: str) -> dict[int, float]:
    words = _WORD.findall(clip(text).lower())
    feats: dict[int, float] = {}
    grams = [(w, 1.0) for w in words] + [(a + " " + b, 0.5) for a, b in zip(words, words[1:])]
    for g, weight in grams:
      h = zlib.crc32(g.encode(), self.seed)
      idx = h % self.dim
      sign = 1.0 if (h >> 31) & 1 else -1.0
      feats[idx] = feats.get(idx, 0.0) + sign * weight
    return feats

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, t in enumerate(texts):
      for idx, v in self._features(t).items():
        out[i, idx] = v
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-12)


class CachedEncoder(TextEncoder):
  """Memoises another encoder in memory (a bounded LRU) and, optionally, in an SQLite file on disk.

  Texts are clipped to MAX_TEXT_CHARS before anything else (the wrapped encoder reads the clipped
  text). Keys are sha1(clipped text) under the wrapped encoder's name, so caches of different
  encoders never mix. At most `capacity` vectors stay in RAM; the least recently used goes first.
  """

  def __init__(self, encoder: TextEncoder, path: str | pathlib.Path | None = None, *,
               capacity: int = MEMORY_ENTRIES):
    if capacity < 1:
      raise errors.ConfigError(f"an embedding cache needs capacity >= 1, got {capacity}")
    self.inner = encoder
    self.name = encoder.name
    self.dim = encoder.dim
    self.capacity = int(capacity)
    self._mem: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
    self._lock = threading.Lock()
    self._db = None
    self.path = None if path is None else pathlib.Path(path)
    if path is not None:
      path = self.path
      path.parent.mkdir(parents=True, exist_ok=True)
      try:
        self._db = sqlite_wal.open_wal(
            path, ["CREATE TABLE IF NOT EXISTS emb (encoder TEXT, key TEXT, vec BLOB, "
                   "PRIMARY KEY (encoder, key))"])
      except sqlite3.DatabaseError as e:
        raise sqlite_wal.damaged(path, "the embedding cache", e, _REMEDY) from None
      try:
        sqlite_wal.check_intact(self._db, path, "the embedding cache", _REMEDY)
      except errors.DataError:
        self._db.close()
        raise
    self.hits = 0
    self.misses = 0

  def __len__(self) -> int:
    """Vectors held in RAM (at most `capacity`)."""
    return len(self._mem)

  @staticmethod
  def _key(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()

  def _keep(self, key: str, vec: np.ndarray) -> None:
    """Holds `vec` in RAM as the most recently used; the least recently used beyond capacity go."""
    self._mem[key] = vec
    self._mem.move_to_end(key)
    while len(self._mem) > self.capacity:
      self._mem.popitem(last=False)

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    texts = [clip(t) for t in texts]
    keys = [self._key(t) for t in texts]
    out = np.zeros((len(texts), self.dim), np.float32)
    todo: dict[str, list[int]] = {}
    with self._lock:
      for i, k in enumerate(keys):
        v = self._mem.get(k)
        if v is not None:
          self._mem.move_to_end(k)
        elif self._db is not None:
          row = self._fetch(k)
          if row is not None:
            v = self._vector(k, row[0])
            self._keep(k, v)
        if v is None:
          todo.setdefault(k, []).append(i)
        else:
          out[i] = v
          self.hits += 1
    if todo:
      uniq = list(todo)
      vecs = self.inner.encode([texts[todo[k][0]] for k in uniq]).astype(np.float32)
      with self._lock:
        for k, v in zip(uniq, vecs):
          self._keep(k, v)
          for i in todo[k]:
            out[i] = v
          self.misses += len(todo[k])
        if self._db is not None:
          try:
            self._db.executemany("INSERT OR REPLACE INTO emb VALUES (?, ?, ?)",
                                 [(self.name, k, v.tobytes()) for k, v in zip(uniq, vecs)])
            self._db.commit()
          except sqlite3.DatabaseError as e:
            raise sqlite_wal.damaged(self.path, "the embedding cache", e, _REMEDY) from None
    return out

  def _fetch(self, key: str):
    try:
      return self._db.execute("SELECT vec FROM emb WHERE encoder=? AND key=?",
                              (self.name, key)).fetchone()
    except sqlite3.DatabaseError as e:
      raise sqlite_wal.damaged(self.path, "the embedding cache", e, _REMEDY) from None

  def _vector(self, key: str, blob) -> np.ndarray:
    """A stored vector; one of the wrong size (a damaged row) is a DataError, never used."""
    if not isinstance(blob, bytes) or len(blob) != 4 * self.dim:
      size = len(blob) if isinstance(blob, bytes) else type(blob).__name__
      raise errors.DataError(f"{self.path}: the embedding cache's row {key[:12]} ({self.name}) "
                             f"holds {size} bytes, not {4 * self.dim}; {_REMEDY}")
    return np.frombuffer(blob, np.float32).copy()


_REGISTRY: dict[str, Callable[..., TextEncoder]] = {
    "hashing": lambda dim=384, seed=0, **_: HashingEncoder(dim=dim, seed=seed),
}


def register_encoder(name: str, factory: Callable[..., TextEncoder]) -> None:
  """Adds an encoder factory (e.g. the MiniLM encoder registers itself as 'minilm')."""
  _REGISTRY[name] = factory


def make_encoder(name: str, cache_path: str | pathlib.Path | None = None, **kwargs) -> TextEncoder:
  """Builds a registered encoder by name, wrapped in a cache. Unknown names raise ConfigError."""
  if name not in _REGISTRY:
    # Optional encoders register on import of their module.
    try:
      import importlib
      importlib.import_module(f"gp_jax.text.{name}")
    except ImportError:
      pass
  if name not in _REGISTRY:
    raise errors.unknown_name("text encoder", name, _REGISTRY)
  return CachedEncoder(_REGISTRY[name](**kwargs), cache_path)
