"""Shared pieces of the fault-injection tests (training and evaluation against the test server)."""
import contextlib
import signal

# Server fault kind -> the kind the pool counts it under.
POOL_KIND = {"timeout": "timeout", "http_500": "http_500", "http_429": "http_429",
             "reset": "connection", "malformed": "malformed", "empty": "empty"}


@contextlib.contextmanager
def deadline(seconds: float):
  """Raises TimeoutError in the main thread if the block runs longer than `seconds`."""
  def expire(signum, frame):
    raise TimeoutError(f"still running after {seconds} s: something hangs")
  old = signal.signal(signal.SIGALRM, expire)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)
