"""The OpenAI-compatible HTTP pool: asynchronous chat completions from vLLM (or any such server).

Each catalog LLM is served by one or more replicas (see gp_jax/llm/endpoints.py). A call goes to
the replica with the lowest in-flight load relative to its concurrency limit, holds one of that
replica's slots only while the HTTP request is open, and retries transient faults (connection
errors, timeouts, 429, 5xx) with exponential backoff and full jitter, possibly on another replica.
Other 4xx answers are not retried. Malformed or empty answers come back as failed Completions.
`chat` never raises for backend faults and never waits longer than `total_timeout_s`.
`chat_stream` asks for `stream: true` and hands the answer's pieces over as they arrive (the
router server streams its final call that way); it retries only until the first piece went out.
Completions carry the server's finish_reason ('length': cut by max_tokens).

Token usage comes from the server's `usage` field and becomes $ through the catalog prices.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import random
import time
from typing import Mapping, Sequence

import aiohttp

from gp_jax import errors
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import endpoints as endpoints_lib

# Session closers of live loops (see _LoopState): strong references, dropped when they finish.
_CLOSERS: set = set()

# Faults worth trying again: the same request may well succeed a moment later or on another replica.
_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})


class _Replica:
  """One endpoint as seen from one event loop: its concurrency limit and open requests."""

  def __init__(self, endpoint: endpoints_lib.Endpoint, limit: int):
    self.endpoint = endpoint
    self.limit = limit
    self.in_flight = 0
    self.models: list[str] = []  # catalog names it serves (whose waiters may take a freed slot)


class _LoopState:
  """Everything bound to one asyncio event loop: the aiohttp session and the slot scheduler.

  A call takes a slot on the least loaded replica (in-flight / limit) that has one free. When all
  are full it queues; a freed slot is handed straight to the oldest waiter of any model that replica
  serves, so a fast replica takes more calls than a slow one and no slot sits idle.
  """

  def __init__(self, endpoints: Mapping[str, Sequence[endpoints_lib.Endpoint]], limit: int,
               connect_timeout_s: float):
    self.loop = asyncio.get_running_loop()
    by_url: dict[tuple[str, str], _Replica] = {}
    self.replicas: dict[str, list[_Replica]] = {}
    for name, eps in endpoints.items():
      # Two catalog names served by the same server model share that replica's limit.
      reps = [by_url.setdefault((e.base_url, e.model), _Replica(e, limit)) for e in eps]
      for r in reps:
        r.models.append(name)
      self.replicas[name] = reps
    self.waiters: dict[str, collections.deque] = {name: collections.deque() for name in endpoints}
    self._seq = itertools.count()
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30.0)
    self.session = aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(sock_connect=connect_timeout_s))
    # asyncio.run cancels every pending task before closing its loop: this one then closes the
    # session while the loop still runs, so `asyncio.run(pool.chat(...))` leaks no connection
    # (gp_jax.util.aio does the same for its reused loop at exit). A loop holds its tasks only weakly:
    # _CLOSERS keeps this one alive after the pool is dropped, until its loop cancels it.
    self.closer = self.loop.create_task(self._close_when_cancelled())
    _CLOSERS.add(self.closer)
    self.closer.add_done_callback(_CLOSERS.discard)

  async def _close_when_cancelled(self) -> None:
    try:
      await self.loop.create_future()
    finally:
      await self.session.close()

  async def close(self) -> None:
    self.closer.cancel()
    await asyncio.gather(self.closer, return_exceptions=True)

  def _take(self, name: str, avoid: _Replica | None, rng: random.Random) -> _Replica | None:
    free = [r for r in self.replicas[name] if r.in_flight < r.limit]
    if avoid is not None and len(free) > 1:
      free = [r for r in free if r is not avoid]
    if not free:
      return None
    best = min(r.in_flight / r.limit for r in free)
    replica = rng.choice([r for r in free if r.in_flight / r.limit == best])
    replica.in_flight += 1
    return replica

  async def acquire(self, name: str, avoid: _Replica | None, rng: random.Random) -> _Replica:
    """A slot on a replica of `name` (waits in FIFO order when all are full)."""
    queue = self.waiters[name]
    if not queue:
      replica = self._take(name, avoid, rng)
      if replica is not None:
        return replica
    entry = (next(self._seq), self.loop.create_future())
    queue.append(entry)
    try:
      return await entry[1]
    except BaseException:
      fut = entry[1]
      if fut.done() and not fut.cancelled():
        self.release(fut.result())  # handed a slot at the moment it was cancelled: give it back
      else:
        fut.cancel()
        try:
          queue.remove(entry)
        except ValueError:
          pass
      raise

  def release(self, replica: _Replica) -> None:
    replica.in_flight -= 1
    oldest = None
    for name in replica.models:
      queue = self.waiters[name]
      while queue and queue[0][1].done():
        queue.popleft()
      if queue and (oldest is None or queue[0][0] < oldest[0][0]):
        oldest = (queue[0], queue)
    if oldest is not None:
      entry, queue = oldest
      queue.popleft()
      replica.in_flight += 1
      entry[1].set_result(replica)


class _Fault(Exception):
  """One failed attempt: `kind` names it; `retryable` says whether to try again."""

  def __init__(self, kind: str, retryable: bool, retry_after: float | None = None,
               input_tokens: int = 0, output_tokens: int = 0, replica: "_Replica | None" = None):
    super().__init__(kind)
    self.replica = replica
    self.kind = kind
    self.retryable = retryable
    self.retry_after = retry_after
    self.input_tokens = input_tokens
    self.output_tokens = output_tokens


def _parse_retry_after(value: str | None) -> float | None:
  try:
    return max(0.0, float(value)) if value is not None else None
  except ValueError:
    return None


def parse_chat_response(status: int, body: bytes, headers: Mapping[str, str] | None = None
                        ) -> tuple[str, int, int]:
  """Reads one /chat/completions answer.

  Returns:
    (text, prompt_tokens, completion_tokens).

  Raises:
    _Fault: for non-200 statuses, bodies that are not the expected JSON, and empty content.
  """
  return _parse_chat(status, body, headers)[:3]


def _check_status(status: int, headers: Mapping[str, str] | None) -> None:
  if status != 200:
    retryable = status >= 500 or status in _RETRYABLE_STATUS
    retry_after = _parse_retry_after((headers or {}).get("Retry-After"))
    raise _Fault(f"http_{status}", retryable, retry_after)


def _parse_chat(status: int, body: bytes, headers: Mapping[str, str] | None = None
                ) -> tuple[str, int, int, str | None]:
  """parse_chat_response, and the choice's finish_reason (None when absent)."""
  _check_status(status, headers)
  try:
    data = json.loads(body)
    choice = data["choices"][0]
    content = choice["message"]["content"]
    usage = data["usage"]
    n_in, n_out = usage["prompt_tokens"], usage.get("completion_tokens", 0)
  except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError):
    raise _Fault("malformed", retryable=False) from None
  return _checked(content, n_in, n_out) + (_finish_reason(choice),)


def _finish_reason(choice) -> str | None:
  reason = choice.get("finish_reason") if isinstance(choice, dict) else None
  return reason if isinstance(reason, str) else None


def _checked(content, n_in, n_out) -> tuple[str, int, int]:
  if not (isinstance(n_in, int) and isinstance(n_out, int) and n_in >= 0 and n_out >= 0):
    raise _Fault("malformed", retryable=False)
  if content is None or (isinstance(content, str) and not content.strip()):
    raise _Fault("empty", retryable=False, input_tokens=n_in, output_tokens=n_out)
  if not isinstance(content, str):
    raise _Fault("malformed", retryable=False)
  return content, n_in, n_out


async def _read_stream(resp: aiohttp.ClientResponse, on_delta, emitted: list
                       ) -> tuple[str, int, int, str | None]:
  """Reads a streamed /chat/completions answer (SSE chunks), handing each piece of content to
  `on_delta` as it arrives; `emitted` gets True once a piece went out (no retry after that).
  Token counts come from the usage chunk (stream_options.include_usage); a server that sends
  none is counted as 0 input tokens and one output token per content chunk."""
  parts: list[str] = []
  usage = None
  finish = None
  chunks = 0
  async for raw in resp.content:
    line = raw.decode("utf-8", errors="replace").strip()
    if not line.startswith("data:"):
      continue   # comments, event names, blank separators
    data = line[len("data:"):].strip()
    if data == "[DONE]":
      break
    try:
      obj = json.loads(data)
    except json.JSONDecodeError:
      raise _Fault("malformed", retryable=not emitted) from None
    if not isinstance(obj, dict):
      raise _Fault("malformed", retryable=not emitted)
    if obj.get("error"):
      raise _Fault("stream_error", retryable=not emitted)
    if isinstance(obj.get("usage"), dict):
      usage = obj["usage"]
    for choice in obj.get("choices") or ():
      delta = choice.get("delta") if isinstance(choice, dict) else None
      piece = delta.get("content") if isinstance(delta, dict) else None
      if isinstance(piece, str) and piece:
        parts.append(piece)
        chunks += 1
        emitted.append(True)
        on_delta(piece)
      finish = _finish_reason(choice) or finish
  text = "".join(parts)
  if usage is not None:
    n_in, n_out = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
  else:
    n_in, n_out = 0, chunks
  try:
    return _checked(text, n_in, n_out) + (finish,)
  except _Fault as f:
    f.retryable = f.retryable and not emitted
    raise


class OpenAIPool(base.LLMPool):
  """Chat completions from OpenAI-compatible servers, balanced over replicas.

  Usable from several event loops one after the other (e.g. repeated `asyncio.run`): sessions and
  limits are created per running loop.
  """

  def __init__(self, catalog: catalog_lib.Catalog,
               endpoints: Mapping[str, Sequence[endpoints_lib.Endpoint]] | str | os.PathLike, *,
               max_concurrency: int = 64,
               timeout_s: float = 120.0,
               connect_timeout_s: float = 5.0,
               total_timeout_s: float | None = None,
               max_retries: int = 4,
               backoff_base_s: float = 0.5,
               backoff_max_s: float = 8.0,
               check: bool = False,
               seed: int = 0):
    """Builds the pool.

    Args:
      catalog: the LLM catalog (prices -> $ cost).
      endpoints: catalog name -> replicas, or the path of an endpoints file.
      max_concurrency: open requests allowed per replica.
      timeout_s: limit of one HTTP attempt (connect to last byte).
      connect_timeout_s: limit of the TCP connect of one attempt.
      total_timeout_s: limit of one `chat` call, retries and backoff included; default
        (max_retries + 1) * timeout_s + the backoff sleeps.
      max_retries: attempts after the first on retryable faults.
      backoff_base_s, backoff_max_s: the n-th retry sleeps uniform(0, min(max, base * 2**n)).
      check: probe every replica's /models now; unreachable -> BackendError.
      seed: seed of the jitter and of replica tie-breaking.
    """
    super().__init__(catalog)
    if isinstance(endpoints, (str, os.PathLike)):
      endpoints = endpoints_lib.load_endpoints(endpoints, catalog)
    else:
      endpoints = endpoints_lib.parse_endpoints(endpoints, source="endpoints", catalog=catalog)
    if max_concurrency < 1:
      raise errors.ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
    if timeout_s <= 0 or max_retries < 0:
      raise errors.ConfigError("timeout_s must be > 0 and max_retries >= 0")
    self.endpoints = endpoints
    self.max_concurrency = max_concurrency
    self.timeout_s = timeout_s
    self.connect_timeout_s = connect_timeout_s
    self.max_retries = max_retries
    self.backoff_base_s = backoff_base_s
    self.backoff_max_s = backoff_max_s
    backoff_total = sum(min(backoff_max_s, backoff_base_s * 2 ** n) for n in range(max_retries))
    self.total_timeout_s = (total_timeout_s if total_timeout_s is not None
                            else (max_retries + 1) * timeout_s + backoff_total)
    self._rng = random.Random(seed)
    self._state: _LoopState | None = None
    self._stats: collections.Counter = collections.Counter()
    if check:
      endpoints_lib.check_reachable(endpoints, timeout_s=connect_timeout_s)

  # ---- per-loop state ----
  def _loop_state(self) -> _LoopState:
    loop = asyncio.get_running_loop()
    if self._state is None or self._state.loop is not loop:
      # A previous loop's session cannot be closed from here; its loop is usually closed already.
      self._state = _LoopState(self.endpoints, self.max_concurrency, self.connect_timeout_s)
    return self._state

  # ---- one attempt ----
  async def _attempt(self, state: _LoopState, model: str, avoid: _Replica | None,
                     messages: Sequence[base.Message], params: base.SamplingParams,
                     deadline: float, on_delta=None, emitted: list | None = None
                     ) -> tuple[_Replica | None, tuple[str, int, int, str | None]]:
    """One HTTP attempt on the best free replica; the slot is held only while the request is open.

    on_delta: stream the answer (`stream: true`), handing it pieces as they come.
    Returns (replica used, (text, prompt_tokens, completion_tokens, finish_reason)).
    Raises _Fault (not retryable once a streamed piece went out).
    """
    emitted = [] if emitted is None else emitted
    replica = None
    try:
      async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
        replica = await state.acquire(model, avoid, self._rng)
        try:
          self._stats[f"requests/{replica.endpoint.base_url}"] += 1
          payload = self._payload(replica.endpoint.model, messages, params)
          if on_delta is not None:
            payload.update(stream=True, stream_options={"include_usage": True})
          async with asyncio.timeout(self.timeout_s):
            async with state.session.post(replica.endpoint.chat_url, json=payload) as resp:
              if on_delta is None or resp.status != 200:
                body = await resp.read()
                return replica, _parse_chat(resp.status, body, resp.headers)
              return replica, await _read_stream(resp, on_delta, emitted)
        finally:
          state.release(replica)
    except _Fault as f:
      f.replica = replica
      raise
    except asyncio.TimeoutError:
      raise _Fault("timeout", retryable=not emitted, replica=replica) from None
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError):
      raise _Fault("connection", retryable=not emitted, replica=replica) from None
    except aiohttp.ClientError:
      raise _Fault("client_error", retryable=not emitted, replica=replica) from None

  def _payload(self, api_model: str, messages: Sequence[base.Message],
               params: base.SamplingParams) -> dict:
    payload = {"model": api_model, "messages": [dict(m) for m in messages],
               "temperature": params.temperature, "max_tokens": params.max_tokens,
               "top_p": params.top_p}
    if params.seed is not None:
      payload["seed"] = params.seed
    if params.stop:
      payload["stop"] = list(params.stop)
    return payload

  # ---- the interface ----
  async def chat(self, model: str, messages: Sequence[base.Message],
                 params: base.SamplingParams = base.SamplingParams()) -> base.Completion:
    return await self._chat(model, messages, params, None)

  async def chat_stream(self, model: str, messages: Sequence[base.Message],
                        params: base.SamplingParams, on_delta) -> base.Completion:
    """`chat` with `stream: true`: pieces of the answer go to `on_delta` as the server sends
    them. Retries as `chat` does until the first piece went out; a fault after that ends the
    call (the text already handed over cannot be taken back)."""
    return await self._chat(model, messages, params, on_delta)

  async def _chat(self, model: str, messages: Sequence[base.Message],
                  params: base.SamplingParams, on_delta) -> base.Completion:
    spec = self.catalog[model]  # unknown names are a misconfiguration: ConfigError
    if model not in self.endpoints:
      raise errors.ConfigError(f"LLM {model!r} has no endpoint; the endpoints file lists "
                               f"{sorted(self.endpoints)}")
    state = self._loop_state()
    start = time.monotonic()
    deadline = start + self.total_timeout_s
    self._stats["calls"] += 1
    last: _Replica | None = None
    kind = "timeout"
    fault: _Fault | None = None
    emitted: list = []
    for attempt in range(self.max_retries + 1):
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        kind = "timeout"
        break
      try:
        _, (text, n_in, n_out, finish) = await self._attempt(
            state, model, last, messages, params, deadline, on_delta, emitted)
      except _Fault as f:
        fault, kind, last = f, f.kind, f.replica
        self._stats[f"faults/{f.kind}"] += 1
      except Exception as e:  # a bug or an unexpected library error must not end the run
        kind = f"internal_{type(e).__name__}"
        fault = _Fault(kind, retryable=False)
        self._stats[f"faults/{kind}"] += 1
      else:
        latency = time.monotonic() - start
        cost = spec.cost_usd(n_in, n_out)
        self._stats["ok"] += 1
        self._record_usage(n_in, n_out, cost, latency)
        return base.Completion(model=model, text=text, input_tokens=n_in, output_tokens=n_out,
                               cost_usd=cost, latency_s=latency, finish_reason=finish)
      if not fault.retryable or attempt == self.max_retries:
        break
      self._stats["retries"] += 1
      sleep = self._rng.uniform(0.0, min(self.backoff_max_s, self.backoff_base_s * 2 ** attempt))
      if fault.retry_after is not None:
        sleep = max(sleep, min(fault.retry_after, self.backoff_max_s))
      await asyncio.sleep(max(0.0, min(sleep, deadline - time.monotonic())))
    latency = time.monotonic() - start
    self._stats["failed"] += 1
    self._stats[f"errors/{kind}"] += 1
    n_in = fault.input_tokens if fault is not None else 0
    n_out = fault.output_tokens if fault is not None else 0
    # An empty answer was still billed: its tokens and cost are real.
    cost = spec.cost_usd(n_in, n_out)
    self._record_usage(n_in, n_out, cost, latency)
    return base.Completion(model=model, text="", input_tokens=n_in, output_tokens=n_out,
                           cost_usd=cost, latency_s=latency, error=kind)

  def _record_usage(self, n_in: int, n_out: int, cost: float, latency: float) -> None:
    self._stats["input_tokens"] += n_in
    self._stats["output_tokens"] += n_out
    self._stats["cost_usd"] += cost
    self._stats["latency_s_sum"] += latency

  def stats(self) -> dict:
    """Counters: calls, ok, failed, retries, errors/<kind> (final outcome of a call),
    faults/<kind> (every failed attempt, retried or not), tokens, cost_usd, latency_s_sum, and
    requests/<base_url> (HTTP requests per replica)."""
    out = {"calls": 0, "ok": 0, "failed": 0, "retries": 0, "input_tokens": 0, "output_tokens": 0,
           "cost_usd": 0.0, "latency_s_sum": 0.0}
    out.update(self._stats)
    return out

  async def aclose(self) -> None:
    state = self._state
    if state is not None and state.loop is asyncio.get_running_loop():
      await state.close()
      self._state = None
