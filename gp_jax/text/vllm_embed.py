"""A text encoder that calls an OpenAI-compatible /v1/embeddings endpoint (e.g. a vLLM server
running an embedding model with `--task embed`).

Host-side and synchronous like every TextEncoder: batches of texts go out as one request each,
with a timeout and retries (backoff with jitter) on connection errors, timeouts, 429 and 5xx.
Rows come back L2-normalised. Wrap it in CachedEncoder (make_encoder does) to embed each text once.
"""
from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from typing import Sequence

import numpy as np

from gp_jax import errors
from gp_jax.text import encoder as encoder_lib


class EmbeddingEndpointEncoder(encoder_lib.TextEncoder):
  """Embeddings from `{base_url}/embeddings` for model `model`."""

  def __init__(self, base_url: str, model: str, *, dim: int | None = None, batch_size: int = 64,
               timeout_s: float = 60.0, max_retries: int = 3, backoff_base_s: float = 0.5,
               seed: int = 0):
    """Builds the encoder; probes the endpoint once when `dim` is not given.

    Args:
      base_url: server base URL in the OpenAI convention (e.g. http://127.0.0.1:8000/v1).
      model: the model name the server exposes.
      dim: embedding width; None asks the server (one request at construction).
      batch_size: texts per request.
      timeout_s: limit of one HTTP request.
      max_retries: retries after the first attempt on transient faults.
      backoff_base_s: the n-th retry sleeps uniform(0, backoff_base_s * 2**n).
      seed: seed of the jitter.

    Raises:
      BackendError: the endpoint is unreachable or answers unusably.
    """
    if not base_url.startswith(("http://", "https://")):
      raise errors.ConfigError(f"embedding base_url must be an http(s) URL, got {base_url!r}")
    if batch_size < 1:
      raise errors.ConfigError(f"batch_size must be >= 1, got {batch_size}")
    self.url = base_url.rstrip("/") + "/embeddings"
    self.model = model
    self.batch_size = batch_size
    self.timeout_s = timeout_s
    self.max_retries = max_retries
    self.backoff_base_s = backoff_base_s
    self._rng = random.Random(seed)
    self.requests = 0
    self.dim = dim if dim is not None else self._request(["dimension probe"]).shape[1]
    self.name = f"embed-{model}-{self.dim}"

  def _post(self, texts: Sequence[str]) -> bytes:
    body = json.dumps({"model": self.model, "input": list(texts)}).encode()
    req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
    self.requests += 1
    with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
      return resp.read()

  def _request(self, texts: Sequence[str]) -> np.ndarray:
    """One batch -> float32 [len(texts), dim]."""
    problem = ""
    for attempt in range(self.max_retries + 1):
      if attempt:
        time.sleep(self._rng.uniform(0.0, self.backoff_base_s * 2 ** (attempt - 1)))
      try:
        raw = self._post(texts)
      except urllib.error.HTTPError as e:
        problem = f"HTTP {e.code}"
        if e.code >= 500 or e.code == 429:
          continue
        raise errors.BackendError(f"{self.url}: {problem} for model {self.model!r}") from None
      except (urllib.error.URLError, OSError, TimeoutError) as e:
        problem = f"unreachable or timed out ({getattr(e, 'reason', e)})"
        continue
      return self._parse(raw, len(texts))
    raise errors.BackendError(f"{self.url}: {problem} after {self.max_retries + 1} attempts")

  def _parse(self, raw: bytes, n: int) -> np.ndarray:
    try:
      data = json.loads(raw)["data"]
      rows = sorted(data, key=lambda r: r["index"])
      vecs = np.asarray([r["embedding"] for r in rows], np.float32)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
      raise errors.BackendError(f"{self.url}: answer is not an embeddings list") from None
    if vecs.ndim != 2 or vecs.shape[0] != n or vecs.shape[1] == 0:
      raise errors.BackendError(
          f"{self.url}: expected {n} embeddings, got array of shape {vecs.shape}")
    if getattr(self, "dim", None) is not None and vecs.shape[1] != self.dim:
      raise errors.BackendError(f"{self.url}: embedding width {vecs.shape[1]} != expected {self.dim}")
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.maximum(norms, 1e-12)

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    """texts: n strings. Returns float32 [n, dim], unit rows."""
    out = np.zeros((len(texts), self.dim), np.float32)
    for start in range(0, len(texts), self.batch_size):
      out[start:start + self.batch_size] = self._request(texts[start:start + self.batch_size])
    return out


encoder_lib.register_encoder(
    "vllm_embed", lambda base_url, model, **kw: EmbeddingEndpointEncoder(base_url, model, **kw))
