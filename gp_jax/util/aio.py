"""Runs host-side coroutines (rollouts, evaluations) on one reused event loop.

`asyncio.run` installs a SIGINT handler whose teardown on Python 3.11 formats the repr of the main
task, result included; with rollout results (arrays) that costs up to a second per call. A reused
loop also keeps HTTP connection pools alive between iterations. At interpreter exit the reused
loops are shut down as `asyncio.run` would do it: pending tasks are cancelled (an HTTP pool's
session closes then) and the loop is closed, so no unclosed-session warnings are printed.
"""
import asyncio
import atexit
import threading

_local = threading.local()
_loops: list[asyncio.AbstractEventLoop] = []
_lock = threading.Lock()


def run(coro):
  """Runs `coro` to completion on this thread's event loop and returns its result."""
  loop = getattr(_local, "loop", None)
  if loop is None or loop.is_closed():
    loop = asyncio.new_event_loop()
    _local.loop = loop
    with _lock:
      _loops.append(loop)
  return loop.run_until_complete(coro)


async def cancel_and_wait(task: asyncio.Task | None) -> None:
  """Cancels a background task (None: nothing) and waits until it has stopped."""
  if task is None:
    return
  task.cancel()
  try:
    await task
  except asyncio.CancelledError:
    pass


def shutdown() -> None:
  """Cancels the pending tasks of every reused loop that is not running, waits for them, closes it."""
  with _lock:
    loops, _loops[:] = list(_loops), []
  for loop in loops:
    if loop.is_closed() or loop.is_running():
      continue
    try:
      tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
      for t in tasks:
        t.cancel()
      if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
      loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
      loop.close()


atexit.register(shutdown)
