"""MiniLM (Flax) encoding speed: sentences per second after compilation.

  python benchmarks/bench_minilm.py [--n 512] [--batch_size 32] [--words 12]
"""
import argparse
import random
import time

from gp_jax.text import minilm

WORDS = ("route query model graph memory planner executor summarizer cheap large answer math code "
         "reason knowledge verify cost token budget workflow role step result").split()


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=512, help="sentences per timed pass")
  ap.add_argument("--batch_size", type=int, default=32)
  ap.add_argument("--words", type=int, default=12, help="words per sentence (sets the bucket)")
  args = ap.parse_args()
  rng = random.Random(0)
  texts = [" ".join(rng.choice(WORDS) for _ in range(args.words)) + f" #{i}" for i in range(args.n)]
  t0 = time.perf_counter()
  enc = minilm.MiniLMEncoder(batch_size=args.batch_size)
  load_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  enc.encode(texts)  # compiles every bucket these texts use
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  enc.encode(texts)
  elapsed = time.perf_counter() - t0
  lengths = [len(ids) for ids in enc.tokenize(texts)]
  print(f"load={load_s:.2f}s first pass (with compilation)={compile_s:.2f}s traces={enc.traces}")
  print(f"sentences={args.n} tokens/sentence={sum(lengths) / len(lengths):.1f} "
        f"batch_size={args.batch_size} elapsed={elapsed:.2f}s -> {args.n / elapsed:.1f} sentences/s")


if __name__ == "__main__":
  main()
