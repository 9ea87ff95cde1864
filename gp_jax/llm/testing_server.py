"""A local OpenAI-compatible HTTP server for tests and benchmarks, with a fixed latency and faults.

It serves `/v1/chat/completions`, `/v1/embeddings`, `/v1/models` and `/health` on 127.0.0.1 and
answers deterministically from the request (the reply echoes the last user message; token counts are
whitespace word counts; `max_tokens` cuts the reply to that many words, with finish_reason "length";
`stream: true` sends it as SSE chunks, one per word). A fault mix injects, at a set rate, the failures a real backend shows:

  timeout    the reply is held back for `timeout_sleep_s` (longer than any client timeout)
  http_500   500 Internal Server Error
  http_429   429 Too Many Requests (with a Retry-After header)
  reset      the TCP connection is reset without a reply
  malformed  200 with a body that is not JSON
  empty      200 with valid JSON whose message content is empty

`script` fixes the outcome of the first requests in order (None = answer normally), which makes retry
tests deterministic. Run in-process with `FakeOpenAIServer(...)` (a context manager that serves from
a background thread) or as a subprocess: `python -m gp_jax.llm.testing_server --port 0 ...`, which
prints `listening on http://127.0.0.1:PORT` once it accepts connections.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import random
import socket
import struct
import sys
import threading
from typing import Sequence

import numpy as np
from aiohttp import web

FAULT_KINDS = ("timeout", "http_500", "http_429", "reset", "malformed", "empty")


@dataclasses.dataclass
class ServerConfig:
  """Behaviour of the fake server.

  Attributes:
    latency_s: fixed delay before every answer.
    fault_rate: probability that a request (after the script) gets a fault.
    faults: fault kinds drawn uniformly when a fault happens.
    script: outcomes of the first len(script) requests (a fault kind or None for a normal answer).
    timeout_sleep_s: how long a 'timeout' fault holds the reply.
    models: model names served; empty accepts any name.
    embedding_dim: width of /v1/embeddings vectors.
    seed: seed of the fault draws.
    stream_piece_s: pause after each piece of a streamed answer (`stream: true`).
  """
  latency_s: float = 0.0
  fault_rate: float = 0.0
  faults: Sequence[str] = FAULT_KINDS
  script: Sequence[str | None] = ()
  timeout_sleep_s: float = 30.0
  models: Sequence[str] = ()
  embedding_dim: int = 32
  seed: int = 0
  stream_piece_s: float = 0.0

  def __post_init__(self):
    bad = [f for f in list(self.faults) + [s for s in self.script if s] if f not in FAULT_KINDS]
    if bad:
      raise ValueError(f"unknown fault kind(s) {bad}; known: {FAULT_KINDS}")
    if not 0.0 <= self.fault_rate <= 1.0:
      raise ValueError(f"fault_rate must be in [0, 1], got {self.fault_rate}")


def reply_text(messages: Sequence[dict]) -> str:
  """The deterministic answer to a chat request: an echo of the last user message."""
  last = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
  return f"echo: {last}"


def count_tokens(text: str) -> int:
  return len(text.split())


def embed_text(text: str, dim: int) -> list[float]:
  """A deterministic unit vector for `text` (seeded by its bytes)."""
  rng = np.random.default_rng(list(text.encode()) or [0])
  v = rng.standard_normal(dim)
  return (v / np.linalg.norm(v)).tolist()


class FakeOpenAIServer:
  """The fake server; counters are readable while it runs (requests, in-flight peak, faults)."""

  def __init__(self, config: ServerConfig | None = None, *, port: int = 0, **kwargs):
    self.config = config or ServerConfig(**kwargs)
    self.port = port
    self._rng = random.Random(self.config.seed)
    self._lock = threading.Lock()
    self.requests = 0            # chat + embedding requests received
    self.in_flight = 0
    self.max_in_flight = 0
    self.faults_sent: dict[str, int] = {}
    self.bodies: list[dict] = []  # parsed chat request bodies, in arrival order
    self._thread: threading.Thread | None = None
    self._loop: asyncio.AbstractEventLoop | None = None
    self._runner: web.AppRunner | None = None
    self._started = threading.Event()
    self._start_error: BaseException | None = None

  @property
  def url(self) -> str:
    """Base URL in the OpenAI convention (ends with /v1)."""
    return f"http://127.0.0.1:{self.port}/v1"

  # ---- fault draw and bookkeeping ----
  def _next_outcome(self) -> str | None:
    with self._lock:
      i = self.requests
      self.requests += 1
      if i < len(self.config.script):
        kind = self.config.script[i]
      elif self.config.fault_rate > 0 and self._rng.random() < self.config.fault_rate:
        kind = self._rng.choice(list(self.config.faults))
      else:
        kind = None
      if kind:
        self.faults_sent[kind] = self.faults_sent.get(kind, 0) + 1
      return kind

  async def _fault(self, request: web.Request, kind: str) -> web.StreamResponse | None:
    """Carries out fault `kind`; returns the response to send, or None to answer normally."""
    if kind == "timeout":
      await asyncio.sleep(self.config.timeout_sleep_s)
      return None
    if kind == "http_500":
      return web.json_response({"error": {"message": "injected fault"}}, status=500)
    if kind == "http_429":
      return web.json_response({"error": {"message": "rate limited"}}, status=429,
                               headers={"Retry-After": "0"})
    if kind == "reset":
      sock = request.transport.get_extra_info("socket") if request.transport else None
      if sock is not None:
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
      if request.transport is not None:
        request.transport.close()
      raise asyncio.CancelledError()
    if kind == "malformed":
      return web.Response(status=200, text='{"id": "x", "choices": [', content_type="application/json")
    return None  # 'empty' is handled by the endpoint, which knows the response shape

  async def _guarded(self, request: web.Request, answer):
    with self._lock:
      self.in_flight += 1
      self.max_in_flight = max(self.max_in_flight, self.in_flight)
    try:
      kind = self._next_outcome()
      if self.config.latency_s > 0:
        await asyncio.sleep(self.config.latency_s)
      if kind:
        resp = await self._fault(request, kind)
        if resp is not None:
          return resp
      return await answer(request, kind == "empty")
    finally:
      with self._lock:
        self.in_flight -= 1

  # ---- endpoints ----
  def _check_model(self, body: dict) -> web.Response | None:
    model = body.get("model")
    if not isinstance(model, str) or (self.config.models and model not in self.config.models):
      return web.json_response({"error": {"message": f"model {model!r} does not exist"}}, status=404)
    return None

  async def _chat_answer(self, request: web.Request, empty: bool) -> web.Response:
    try:
      body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
      return web.json_response({"error": {"message": "invalid JSON body"}}, status=400)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
      return web.json_response({"error": {"message": "messages must be a non-empty list"}}, status=400)
    bad = self._check_model(body)
    if bad is not None:
      return bad
    with self._lock:
      self.bodies.append(body)
    text = "" if empty else reply_text(messages)
    finish = "stop"
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, int) and max_tokens >= 0 and count_tokens(text) > max_tokens:
      text = " ".join(text.split()[:max_tokens])
      finish = "length"
    prompt_tokens = sum(count_tokens(str(m.get("content", ""))) + 2 for m in messages)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": count_tokens(text),
             "total_tokens": prompt_tokens + count_tokens(text)}
    if body.get("stream") is True:
      return await self._stream_answer(request, body, text, finish, usage)
    return web.json_response({
        "id": f"chatcmpl-{self.requests}", "object": "chat.completion", "model": body["model"],
        "choices": [{"index": 0, "finish_reason": finish,
                     "message": {"role": "assistant", "content": text}}],
        "usage": usage,
    })

  async def _stream_answer(self, request: web.Request, body: dict, text: str, finish: str,
                           usage: dict) -> web.StreamResponse:
    """`stream: true`: one SSE chunk per word (with its following space), the finish chunk,
    the usage chunk when stream_options.include_usage, then [DONE]."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    def sse(choices, **extra) -> bytes:
      obj = {"id": f"chatcmpl-{self.requests}", "object": "chat.completion.chunk",
             "model": body["model"], "choices": choices, **extra}
      return f"data: {json.dumps(obj)}\n\n".encode()

    words = text.split(" ")
    pieces = [w + " " for w in words[:-1]] + [words[-1]] if text else []
    await resp.write(sse([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]))
    for piece in pieces:
      await resp.write(sse([{"index": 0, "delta": {"content": piece}, "finish_reason": None}]))
      if self.config.stream_piece_s > 0:
        await asyncio.sleep(self.config.stream_piece_s)
    await resp.write(sse([{"index": 0, "delta": {}, "finish_reason": finish}]))
    if (body.get("stream_options") or {}).get("include_usage"):
      await resp.write(sse([], usage=usage))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp

  async def _embed_answer(self, request: web.Request, empty: bool) -> web.Response:
    try:
      body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
      return web.json_response({"error": {"message": "invalid JSON body"}}, status=400)
    bad = self._check_model(body)
    if bad is not None:
      return bad
    inputs = body.get("input")
    if isinstance(inputs, str):
      inputs = [inputs]
    if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
      return web.json_response({"error": {"message": "input must be a string or list of strings"}},
                               status=400)
    data = [] if empty else [{"object": "embedding", "index": i,
                              "embedding": embed_text(t, self.config.embedding_dim)}
                             for i, t in enumerate(inputs)]
    tokens = sum(count_tokens(t) for t in inputs)
    return web.json_response({"object": "list", "data": data, "model": body["model"],
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

  async def _chat(self, request: web.Request):
    return await self._guarded(request, self._chat_answer)

  async def _embeddings(self, request: web.Request):
    return await self._guarded(request, self._embed_answer)

  async def _health(self, request: web.Request):
    return web.Response(text="")

  async def _models(self, request: web.Request):
    names = list(self.config.models)
    return web.json_response({"object": "list", "data": [{"id": n, "object": "model"} for n in names]})

  def make_app(self) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", self._chat)
    app.router.add_post("/v1/embeddings", self._embeddings)
    app.router.add_get("/v1/models", self._models)
    app.router.add_get("/health", self._health)
    return app

  # ---- lifecycle ----
  async def _start_async(self) -> None:
    self._runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False,
                                 shutdown_timeout=0.1)
    await self._runner.setup()
    site = web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024, reuse_address=True)
    await site.start()
    self.port = site._server.sockets[0].getsockname()[1]

  def _serve_thread(self) -> None:
    self._loop = asyncio.new_event_loop()
    asyncio.set_event_loop(self._loop)
    try:
      self._loop.run_until_complete(self._start_async())
    except BaseException as e:  # reported to start()'s caller
      self._start_error = e
      self._started.set()
      return
    self._started.set()
    self._loop.run_forever()
    self._loop.run_until_complete(self._shutdown())
    self._loop.close()

  async def _shutdown(self) -> None:
    await self._runner.cleanup()
    # Handlers still sleeping (injected timeouts) are cancelled so that none outlives the loop.
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
      t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

  def start(self) -> "FakeOpenAIServer":
    """Serves from a daemon thread; returns once the port accepts connections."""
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
    self._thread = threading.Thread(target=self._serve_thread, daemon=True, name="fake-openai")
    self._thread.start()
    if not self._started.wait(10.0):
      raise RuntimeError("fake OpenAI server did not start within 10 s")
    if self._start_error is not None:
      raise RuntimeError(f"fake OpenAI server failed to start: {self._start_error}")
    return self

  def stop(self) -> None:
    if self._loop is not None and self._thread is not None:
      self._loop.call_soon_threadsafe(self._loop.stop)
      self._thread.join(10.0)
      self._thread = None

  def __enter__(self) -> "FakeOpenAIServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--port", type=int, default=0)
  parser.add_argument("--latency_s", type=float, default=0.0)
  parser.add_argument("--fault_rate", type=float, default=0.0)
  parser.add_argument("--faults", default=",".join(FAULT_KINDS))
  parser.add_argument("--timeout_sleep_s", type=float, default=30.0)
  parser.add_argument("--models", default="", help="comma-separated served model names")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  config = ServerConfig(latency_s=args.latency_s, fault_rate=args.fault_rate,
                        faults=tuple(f for f in args.faults.split(",") if f),
                        timeout_sleep_s=args.timeout_sleep_s,
                        models=tuple(m for m in args.models.split(",") if m), seed=args.seed)
  server = FakeOpenAIServer(config, port=args.port)
  logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
  loop = asyncio.new_event_loop()
  loop.run_until_complete(server._start_async())
  print(f"listening on http://127.0.0.1:{server.port}", flush=True)
  try:
    loop.run_forever()
  except KeyboardInterrupt:
    pass
  finally:
    loop.run_until_complete(server._shutdown())


if __name__ == "__main__":
  sys.exit(main())
