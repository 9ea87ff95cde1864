"""A streamed chat completion (`stream: true`) as OpenAI server-sent events: the stream opens at
once, keep-alive comments while the workflow runs, the final call's tokens as the pool streams
them, the finish and usage chunks, `data: [DONE]`; a failure after the headers went out is one
SSE error event.

Every write has a deadline (the app's stream_write_timeout_s): the client must take the stream's
bytes until at most WRITE_BUFFER_BYTES wait in the server's buffer (beyond what the kernel's
socket buffers hold), and at the end every byte. A client that does not (it never reads, or reads
too slowly) has its connection aborted, which drops what was buffered for it; the workflow, if it
still runs, is cancelled, freeing its slot (`stream_stalled` counts these)."""
from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from gp_jax.serving.engine import admission as admission_lib
from gp_jax.serving.engine import session as session_lib
from gp_jax.serving.http import app_keys
from gp_jax.serving.http import completion as completion_lib
from gp_jax.serving.http import errors as http_errors
from gp_jax.serving.http import openai_schema

STREAM_PIECE_CHARS = 24     # characters of the answer per SSE chunk
KEEPALIVE = b": keep-alive\n\n"   # an SSE comment: clients skip it, proxies see traffic
WRITE_BUFFER_BYTES = 64 << 10   # a stream's bytes the server holds for a client that lags


class StreamStalled(Exception):
  """The client did not take a stream's bytes within the write deadline (its connection was
  aborted)."""


def _sse(obj) -> bytes:
  return f"data: {json.dumps(obj)}\n\n".encode()


class _Stream:
  """One streamed chat completion: the SSE response and the task running the workflow."""

  def __init__(self, request: web.Request, s: session_lib.RouterSession,
               req: openai_schema.ChatRequest, rid: str, admission: admission_lib.Admission):
    self.request, self.s, self.req, self.rid, self.admission = request, s, req, rid, admission
    self.created = int(time.time())
    self.deadline_s = request.app[app_keys.DEADLINE_KEY]
    self.write_timeout_s = request.app[app_keys.WRITE_TIMEOUT_KEY]
    self.ends = time.monotonic() + self.deadline_s
    self.events: asyncio.Queue = asyncio.Queue()
    self.work: asyncio.Task | None = None
    self.resp = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "x-request-id": request[app_keys.REQUEST_ID_KEY], "x-gp-request-id": rid})

  def chunk(self, delta: dict, finish=None, **extra) -> bytes:
    return _sse({"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.req.model, "choices": [{"index": 0, "delta": delta,
                                                       "finish_reason": finish,
                                                       "logprobs": None}], **extra})

  async def send(self, data: bytes, *, last: bool = False) -> None:
    """Writes `data`; returns once at most WRITE_BUFFER_BYTES of the stream wait in the server's
    buffer (`last`: the response ends, and none may wait). Past the write deadline: aborts the
    connection, which drops its buffer, and raises StreamStalled."""
    transport = self.request.transport
    try:
      async with asyncio.timeout(self.write_timeout_s):
        await self.resp.write(data)
        if last:
          await self.resp.write_eof()
          if transport is not None:   # the drain below then waits for an empty buffer
            transport.set_write_buffer_limits(high=0)
        await self.request.writer.drain()
    except TimeoutError:
      if transport is not None:
        transport.abort()
      raise StreamStalled() from None
    finally:
      if last and transport is not None and not transport.is_closing():
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)   # the connection goes on

  async def open(self) -> None:
    """Headers and the role chunk, before the workflow runs; then the workflow's task."""
    try:
      await self.resp.prepare(self.request)
      if self.request.transport is not None:
        self.request.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
      await self.send(self.chunk({"role": "assistant", "content": ""}))
    except BaseException:
      self.admission.cancel()
      raise
    self.work = asyncio.get_running_loop().create_task(completion_lib.run(
        self.s, self.req, self.rid, self.request[app_keys.REQUEST_ID_KEY], self.admission,
        on_delta=self.events.put_nowait, key=app_keys.key_name(self.request)))
    self.work.add_done_callback(self._finished)

  def _finished(self, t: asyncio.Task) -> None:
    self.admission.cancel()   # a task cancelled before it started never took its place
    if not t.cancelled():
      t.exception()           # retrieved here; read again in `answer`
    self.events.put_nowait(self)   # the end marker

  async def relay(self) -> bool:
    """Forwards the final call's pieces as they come, with a keep-alive comment every
    keepalive_s, until the workflow ends; whether any piece came. RequestError 504 (after
    cancelling the workflow) past the deadline."""
    keepalive = self.request.app[app_keys.KEEPALIVE_KEY]
    streamed = False
    while True:
      try:
        item = await asyncio.wait_for(
            self.events.get(), max(0.0, min(keepalive, self.ends - time.monotonic())))
      except TimeoutError:
        if time.monotonic() >= self.ends:
          self.work.cancel()
          await asyncio.wait({self.work})   # its spent calls are logged before the client hears
          self.s.counters["timeout"] += 1
          raise http_errors.RequestError(504, f"no answer within the server's deadline of "
                                         f"{self.deadline_s:g} s", "timeout") from None
        await self.send(KEEPALIVE)
        continue
      if item is self:
        return streamed
      streamed = True
      await self.send(self.chunk({"content": item}))

  async def answer(self, streamed: bool) -> None:
    """The rest of the answer: its text if no piece came, the finish chunk with the route, the
    usage chunk when asked. Raises the workflow's Refusal."""
    served = self.work.result()
    rec = served.record
    self.request.app[app_keys.METRICS_KEY].served(rec)
    if not streamed:   # nothing came through on_delta (e.g. an empty answer): the answer here
      text = served.answer
      for i in range(0, len(text), STREAM_PIECE_CHARS):
        await self.send(self.chunk({"content": text[i:i + STREAM_PIECE_CHARS]}))
    await self.send(self.chunk({}, rec["finish_reason"],
                               graphplanner=completion_lib.extension(rec)))
    if self.req.include_usage:
      await self.send(_sse({"id": self.rid, "object": "chat.completion.chunk",
                            "created": self.created, "model": self.req.model, "choices": [],
                            "usage": rec["usage"]}))

  async def error(self, e: Exception) -> None:
    """A failure after the headers went out: one SSE error event."""
    err = http_errors.as_request_error(e)
    if err is None:
      logging.getLogger(__name__).exception("streamed request failed", exc_info=e)
      err = http_errors.RequestError(500, f"internal error (request id "
                                     f"{app_keys.request_id(self.request)}; the details are in "
                                     "the server log)", "internal_error")
    await self.send(b"event: error\n" + _sse(http_errors.error_body(
        err.status, err.message, err.code, err.param)))

  async def close(self) -> None:
    await self.send(b"data: [DONE]\n\n", last=True)


async def stream(request: web.Request, s: session_lib.RouterSession,
                 req: openai_schema.ChatRequest, rid: str,
                 admission: admission_lib.Admission) -> web.StreamResponse:
  """The answer as OpenAI SSE chunks. The stream opens at once (headers and the role chunk),
  then a keep-alive comment every keepalive_s while the workflow runs; the final call's text as
  the pool streams it (all at once from a pool that cannot stream); the chunk with the
  finish_reason and the route; the usage when asked; [DONE]. A failure after the stream opened
  is one SSE error event (OpenAI's error object), then [DONE]. A client that leaves cancels the
  workflow; so does one that does not take the stream's bytes within the write deadline, whose
  connection is then aborted (StreamStalled). The client key's place was counted at admission,
  before the stream opens (a key over its cap gets a plain 429)."""
  st = _Stream(request, s, req, rid, admission)
  try:
    await st.open()
  except StreamStalled:
    s.counters["stream_stalled"] += 1
    return st.resp
  try:
    try:
      await st.answer(await st.relay())
    except (ConnectionResetError, asyncio.CancelledError, StreamStalled):
      raise
    except Exception as e:   # a Refusal, a RequestError, or a bug: an event of the stream
      await st.error(e)
    finally:
      if not st.work.done():
        st.work.cancel()
    await st.close()
  except StreamStalled:   # the client did not read: cut off, its buffer dropped
    s.counters["stream_stalled"] += 1
  except ConnectionResetError:   # the client left
    s.counters["client_gone"] += 1
  except asyncio.CancelledError:   # the client left (handler cancellation)
    s.counters["client_gone"] += 1
    raise
  return st.resp
