"""Route logs for the export tests, written by the server's own route-log writer
(route_log.RouteLog) with records shaped as serve_router writes them
(gp_jax/serving/engine/session.py)."""
import pathlib
from typing import Iterable, Sequence

from gp_jax.serving.state import route_log as route_log_lib


def call(role: str, llm: str, input_text: str, output_text: str = "ok", step: int = 0) -> dict:
  """One LLM call of a served request."""
  return dict(step=step, role=role, llm=llm, action=0, node=step, input_text=input_text,
              output_text=output_text, input_tokens=len(input_text.split()),
              output_tokens=len(output_text.split()), cost_usd=0.0, latency_s=0.01, error=None)


def route(rid: str, task: str, query: str, calls: Sequence[dict]) -> dict:
  """One served request's record; `model` is the LLM of a passthrough request (one call whose
  input is the query), the router otherwise."""
  model = calls[0]["llm"] if len(calls) == 1 and calls[0]["role"] == "passthrough" else "graphplanner"
  usage = dict(prompt_tokens=sum(c["input_tokens"] for c in calls),
               completion_tokens=sum(c["output_tokens"] for c in calls))
  usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
  return dict(type="route", id=rid, created=1000.0, model=model, alpha=None, key="", task=task,
              query=query, answer=calls[-1]["output_text"], calls=list(calls), usage=usage,
              cost_usd=0.0, history_rows=None, finish_reason="stop", request_id=rid,
              timing=dict(total_s=0.1, backbone_s=0.1, router_s=0.0, compute_s=0.0, decisions=0))


def write(path: pathlib.Path, served: Iterable[tuple[dict, float | None]]) -> pathlib.Path:
  """Writes each (route record, feedback score or None) to a route log at `path`, the feedback
  line right after its request's line; returns the path."""
  log = route_log_lib.RouteLog(path)
  try:
    for record, score in served:
      log.append(record)
      if score is not None:
        log.append(dict(type="feedback", id=record["id"], score=float(score), created=1001.0))
  finally:
    log.close()
  return path


def passthrough_log(path: pathlib.Path,
                    served: Iterable[tuple[str, str, str, float | None]]) -> pathlib.Path:
  """A route log of passthrough requests: (task, query, llm, score or None) each."""
  return write(path, ((route(f"r{i}", task, query, [call("passthrough", llm, query)]), score)
                      for i, (task, query, llm, score) in enumerate(served)))
