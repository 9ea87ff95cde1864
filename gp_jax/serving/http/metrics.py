"""`GET /metrics` of a router server: Prometheus text format, via prometheus_client.

Each app has its own registry (not the library's global one), so two servers in one process
(tests) count separately. Two kinds of series:

  counted per request (by the app's middleware and handlers):
    gp_router_requests_total{endpoint, status}            every answered request
    gp_router_request_seconds{endpoint}                   its latency (histogram)
    gp_router_overhead_per_decision_seconds               router time (total - backbone) per
                                                          decision of a routed completion
    gp_router_backbone_call_errors_total{llm}             failed LLM calls inside served workflows
    gp_router_rate_limited_total{limit}                   429s of the request / feedback limits
  read from the session at scrape time:
    gp_router_in_flight, gp_router_queue_depth, gp_router_max_concurrency
    gp_router_policy_calls_total, gp_router_decisions_total (their ratio: decisions per
      batched policy call), gp_router_decisions_per_policy_call (the mean so far)
    gp_router_memory_rows, gp_router_memory_capacity
    gp_router_feedback_total, gp_router_served_total{kind}, gp_router_unservable_total (502s:
      the backbones could not answer), gp_router_timeouts_total (504s)
    a learning server (--learn, online.py): gp_router_learner_updates_total (PPO updates run),
      gp_router_learner_accepted_total, gp_router_learner_rejected_total{reason} (kl, canary),
      gp_router_learner_shortened_total (accepted with the step shortened to the KL bound),
      gp_router_learner_pending (episodes with feedback waiting), gp_router_learner_rollbacks_total,
      gp_router_learner_paused (1 from a rollback until an admin resumes learning),
      gp_router_learner_dropped_rollback_total (episodes a rollback dropped)

`endpoint` is the route's path pattern; requests to paths the server does not serve share the
label "other", so a scan of random paths cannot grow the series without bound.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client import Counter
from prometheus_client import Histogram
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.core import GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
                    600)
_OVERHEAD_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1)


class _SessionCollector:
  """Series read from the session when /metrics is scraped."""

  def __init__(self, session):
    self.session = session

  def collect(self):
    s = self.session
    c = s.counters
    b = s.batcher

    def gauge(name, doc, value):
      g = GaugeMetricFamily(name, doc)
      g.add_metric([], float(value))
      return g

    def counter(name, doc, value):
      m = CounterMetricFamily(name, doc)
      m.add_metric([], float(value))
      return m

    yield gauge("gp_router_in_flight", "Requests whose workflow or backbone call is running.",
                s.admissions.in_flight)
    yield gauge("gp_router_queue_depth", "Requests waiting for a workflow slot.",
                s.admissions.waiting)
    yield gauge("gp_router_max_concurrency", "Workflows that may run at once.",
                s.admissions.max_concurrency)
    yield counter("gp_router_policy_calls", "Batched policy calls.", b.calls)
    yield counter("gp_router_decisions", "Routing decisions (all batched policy calls).",
                  b.decisions)
    yield gauge("gp_router_decisions_per_policy_call", "Mean decisions per policy call so far.",
                b.decisions / b.calls if b.calls else 0.0)
    mem = s.memory_info()
    yield gauge("gp_router_memory_rows", "History memory rows the decisions read.", mem["rows"])
    yield gauge("gp_router_memory_capacity", "History memory capacity (rows).",
                mem["capacity"])
    yield counter("gp_router_feedback", "Feedback accepted into the memory.", c["feedback"])
    served = CounterMetricFamily("gp_router_served", "Completions answered.",
                                 labels=["kind"])
    served.add_metric(["routed"], float(c["served"]))
    served.add_metric(["passthrough"], float(c["passthrough"]))
    yield served
    yield counter("gp_router_unservable", "Requests the backbones could not answer (502).",
                  c["unservable"])
    yield counter("gp_router_timeouts", "Requests past the deadline (504).", c["timeout"])
    refused = CounterMetricFamily("gp_router_overloaded", "Requests refused at once with 429: "
                                  "every place taken (server), or the key at its cap (key).",
                                  labels=["scope"])
    refused.add_metric(["server"], float(c["overloaded"]))
    refused.add_metric(["key"], float(c["key_overloaded"]))
    yield refused
    yield counter("gp_router_streams_stalled", "Streams cut off because the client did not take "
                  "their bytes within --stream_write_timeout_s.", c["stream_stalled"])
    learner = getattr(s, "learner", None)
    if learner is not None:
      lc = learner.counters
      yield counter("gp_router_learner_updates", "Online PPO updates run.", lc["updates"])
      yield counter("gp_router_learner_accepted", "Online updates accepted as new versions.",
                    lc["accepted"])
      rejected = CounterMetricFamily("gp_router_learner_rejected", "Online updates rejected "
                                     "by the KL limit or the canary.", labels=["reason"])
      for reason in ("kl", "canary"):
        rejected.add_metric([reason], float(lc[f"rejected_{reason}"]))
      yield rejected
      yield counter("gp_router_learner_shortened", "Accepted updates whose step was shortened "
                    "to the KL bound.", lc["shortened"])
      yield counter("gp_router_learner_rollbacks", "Rollbacks to an earlier version.",
                    lc["rollbacks"])
      yield gauge("gp_router_learner_pending", "Episodes with feedback waiting for an update.",
                  len(learner.pending))
      yield gauge("gp_router_learner_paused", "1 while learning is paused by a rollback (until "
                  "POST /v1/router/resume).", learner.paused is not None)
      yield counter("gp_router_learner_dropped_rollback", "Episodes a rollback dropped: those "
                    "waiting for an update, and feedback on requests that discarded versions "
                    "decided.", lc["dropped_rollback"] + lc["not_learned_rollback"])


class Metrics:
  """The Prometheus series of one app (module docstring)."""

  def __init__(self, session=None):
    self.registry = CollectorRegistry(auto_describe=True)
    r = self.registry
    self.requests = Counter("gp_router_requests", "Answered HTTP requests.",
                            ["endpoint", "status"], registry=r)
    self.latency = Histogram("gp_router_request_seconds", "HTTP request latency (seconds).",
                             ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
    self.overhead = Histogram("gp_router_overhead_per_decision_seconds",
                              "Router time (total - backbone) per decision of a routed "
                              "completion (seconds).", buckets=_OVERHEAD_BUCKETS, registry=r)
    self.backbone_errors = Counter("gp_router_backbone_call_errors",
                                   "Failed LLM calls inside served workflows.", ["llm"],
                                   registry=r)
    self.rate_limited = Counter("gp_router_rate_limited", "Requests refused by a rate limit "
                                "(429).", ["limit"], registry=r)
    if session is not None:
      r.register(_SessionCollector(session))
    # The labelled children by label values: a label lookup takes a lock and builds a key on
    # every call; the endpoints and statuses are few.
    self._children: dict = {}

  def request(self, endpoint: str, status: int | str, seconds: float) -> None:
    key = (endpoint, status)
    children = self._children.get(key)
    if children is None:
      children = self._children[key] = (self.requests.labels(endpoint, str(status)),
                                        self.latency.labels(endpoint))
    children[0].inc()
    children[1].observe(seconds)

  def served(self, record: dict) -> None:
    """Counts one answered completion from its route record."""
    timing = record.get("timing") or {}
    decisions = timing.get("decisions") or 0
    if decisions:
      self.overhead.observe(timing.get("router_s", 0.0) / decisions)
    for call in record.get("calls", ()):
      if call.get("error"):
        self.backbone_errors.labels(call.get("llm", "?")).inc()

  def render(self) -> bytes:
    return generate_latest(self.registry)
