"""Runs host-side coroutines (rollouts, evaluations) on one reused event loop.

`asyncio.run` installs a SIGINT handler whose teardown on Python 3.11 formats the repr of the main
task, result included; with rollout results (arrays) that costs up to a second per call. A reused
loop also keeps HTTP connection pools alive between iterations.
"""
import asyncio
import threading

_local = threading.local()


def run(coro):
  """Runs `coro` to completion on this thread's event loop and returns its result."""
  loop = getattr(_local, "loop", None)
  if loop is None or loop.is_closed():
    loop = asyncio.new_event_loop()
    _local.loop = loop
  return loop.run_until_complete(coro)
