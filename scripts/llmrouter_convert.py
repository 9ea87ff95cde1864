"""Converts the query embeddings of `experiments.export_routes --embeddings` (.npy) to the torch .pt
file that LLMRouter's `query_embedding_data` names. Run it with the LLMRouter venv's python (gp_jax
itself never imports torch):

  PY="$(bash scripts/setup_llmrouter.sh)"
  "$PY" scripts/llmrouter_convert.py query_embeddings.npy query_embeddings.pt

The .pt holds one float32 tensor [N, d] (row i: the query of embedding_id i), which LLMRouter's
loader (torch.load) reads as it is. Bad input is one `error:` line and exit status 2.
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import torch


def _fail(message: str):
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def convert(src: str, dst: str) -> tuple[int, int]:
  """Writes the [N, d] matrix of the .npy file `src` as a float32 tensor to `dst`, atomically;
  returns its shape."""
  try:
    matrix = np.load(src, allow_pickle=False)
  except (OSError, ValueError) as e:
    _fail(f"{src}: cannot read the embeddings ({e})")
  if matrix.ndim != 2 or not np.issubdtype(matrix.dtype, np.floating):
    _fail(f"{src}: expected a float matrix [N, d], got {matrix.dtype} {list(matrix.shape)}")
  tensor = torch.from_numpy(np.ascontiguousarray(matrix, np.float32))
  folder = os.path.dirname(os.path.abspath(dst))
  tmp = None
  try:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(dst)}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      torch.save(tensor, f)
    os.replace(tmp, dst)
  except OSError as e:
    if tmp is not None and os.path.exists(tmp):
      os.unlink(tmp)
    _fail(f"{dst}: cannot write the embeddings ({e.strerror or e})")
  return tuple(tensor.shape)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("npy", help="embeddings written by export_routes --embeddings")
  parser.add_argument("pt", help="the .pt file to write (LLMRouter's query_embedding_data)")
  args = parser.parse_args()
  if not args.pt.endswith(".pt"):
    _fail(f"{args.pt}: the output must be a .pt file")
  n, d = convert(args.npy, args.pt)
  print(f"{n} query embeddings [{n}, {d}] -> {args.pt}", file=sys.stderr)


if __name__ == "__main__":
  main()
