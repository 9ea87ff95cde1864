"""pass@1 for MBPP and HumanEval: build the test program for a reply and run it in the sandbox.

The candidate code is executed as module "solution" (not "__main__", so a reply's demo block under
`if __name__ == "__main__":` does not run, as in the official HumanEval harness), then the row's
tests run in the same namespace. The program prints a per-run random token after the last test; a
reply that exits early (sys.exit(0), os._exit(0)) never prints it and so does not pass.
"""
from __future__ import annotations

import ast
import re
import secrets
from typing import Sequence

from gp_jax import errors
from gp_jax import types
from gp_jax.tasks import sandbox as sandbox_lib

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(reply: str, entry_point: str | None = None) -> str:
  """The code in a model reply.

  Takes the fenced block that defines `entry_point` (else the first python/unlabelled fenced
  block, else the whole reply).

  Args:
    reply: the model's reply.
    entry_point: the function the tests call, if known.
  """
  blocks = [(lang.lower(), body) for lang, body in _FENCE_RE.findall(reply)]
  code_blocks = [b for lang, b in blocks if lang in ("", "python", "py", "python3")]
  if entry_point:
    for body in code_blocks:
      if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", body, re.MULTILINE):
        return body
  if code_blocks:
    return code_blocks[0]
  return reply


def mbpp_tests(query: types.Query) -> tuple[list[str], str]:
  """(test assertions, setup code) of an MBPP row: meta["tests"] or the LLMRouter ground truth.

  Raises:
    DataError: no readable tests.
  """
  tests = query.meta.get("tests")
  if tests is None:
    try:
      tests = ast.literal_eval(query.ground_truth)
    except (ValueError, SyntaxError):
      tests = None
  if not isinstance(tests, (list, tuple)) or not tests or \
      not all(isinstance(t, str) for t in tests):
    raise errors.DataError(f"query {query.qid}: MBPP row has no test list "
                           "(meta['tests'] or a list literal in ground_truth)")
  return list(tests), str(query.meta.get("test_setup_code") or "")


def humaneval_entry_point(query: types.Query) -> str:
  """meta["entry_point"], else the last top-level function defined in the prompt."""
  ep = query.meta.get("entry_point")
  if ep:
    return str(ep)
  names = re.findall(r"^def\s+(\w+)\s*\(", query.query, re.MULTILINE)
  if not names:
    raise errors.DataError(f"query {query.qid}: HumanEval row without entry point")
  return names[-1]


def _harness(candidate: str, tests: str, token: str) -> str:
  # repr() keeps the candidate and the tests as data until they are compiled, so a reply cannot
  # break out of the harness text.
  # The token goes straight to fd 1, so a reply that rebinds print or sys.stdout cannot lose it.
  return (
      "import os as _os, sys as _sys\n"
      "_write, _stdout = _os.write, _sys.stdout\n"
      "_ns = {'__name__': 'solution', '__builtins__': __builtins__}\n"
      f"exec(compile({candidate!r}, 'solution.py', 'exec'), _ns)\n"
      f"exec(compile({tests!r}, 'tests.py', 'exec'), _ns)\n"
      "_stdout.flush()\n"
      f"_write(1, {(chr(10) + token + chr(10)).encode()!r})\n")


def build_program(prediction: str, query: types.Query, token: str) -> str:
  """The test program for `prediction` on an MBPP or HumanEval row.

  Raises:
    DataError: the row lacks what its tests need.
    ConfigError: the row is not a code task.
  """
  task = query.task_name
  if task == "mbpp":
    tests, setup = mbpp_tests(query)
    code = extract_code(prediction)
    return _harness(code, setup + "\n" + "\n".join(tests) + "\n", token)
  if task == "human_eval":
    entry = humaneval_entry_point(query)
    code = extract_code(prediction, entry)
    if not re.search(rf"^def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
      # A bare body (the HumanEval completion format): append it to the prompt.
      code = query.query + code
    else:
      # A whole function: keep the prompt's imports and helper definitions before it.
      code = _prompt_header(query.query, entry) + "\n" + code
    return _harness(code, query.ground_truth + f"\n\ncheck({entry})\n", token)
  raise errors.ConfigError(f"task {task!r} has no code tests")


def _prompt_header(prompt: str, entry: str) -> str:
  """The prompt up to the definition of `entry` (imports, constants, helper functions)."""
  m = re.search(rf"^def\s+{re.escape(entry)}\s*\(", prompt, re.MULTILINE)
  return prompt[:m.start()] if m else ""


def code_pass_many(predictions: Sequence[str], queries: Sequence[types.Query], *,
                   sandbox: sandbox_lib.Sandbox | None = None,
                   wall_s: float = 10.0) -> list[float]:
  """pass@1 (1.0 / 0.0) of each prediction on its row, run in parallel in the sandbox.

  Args:
    predictions: model replies, parallel to `queries`.
    queries: MBPP or HumanEval rows.
    sandbox: the sandbox to use (default: the process-wide one).
    wall_s: wall-clock limit per program.
  """
  if len(predictions) != len(queries):
    raise errors.ConfigError("predictions and queries differ in length")
  sb = sandbox or sandbox_lib.default_sandbox()
  tokens = [f"__gp_jax_tests_done_{secrets.token_hex(8)}__" for _ in predictions]
  programs = [build_program(p, q, t) for p, q, t in zip(predictions, queries, tokens)]
  results = sb.run_many(programs, wall_s=wall_s)
  return [1.0 if _passed(r, t) else 0.0 for r, t in zip(results, tokens)]


def _passed(result: sandbox_lib.SandboxResult, token: str) -> bool:
  lines = result.stdout.rstrip("\n").splitlines()
  return result.passed and bool(lines) and lines[-1] == token


def code_pass(prediction: str, query: types.Query, *,
              sandbox: sandbox_lib.Sandbox | None = None, wall_s: float = 10.0) -> float:
  """pass@1 of one prediction (see code_pass_many)."""
  return code_pass_many([prediction], [query], sandbox=sandbox, wall_s=wall_s)[0]
