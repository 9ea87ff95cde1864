"""The router server's settings: one dataclass, read from the server's ml_collections config
(experiments/configs/serve.py), with the runner's flags as overrides (FLAGS).

`from_config` validates everything that can be checked before the router loads (a bad value is
one ConfigError, before the slow start); `store_config` and `state_dir` resolve where the
served state lives.
"""
from __future__ import annotations

import dataclasses
import pathlib

from gp_jax import config_lists
from gp_jax import errors
from gp_jax.serving.engine import placement
from gp_jax.serving.http import auth
from gp_jax.serving.http import limits
from gp_jax.serving.learning import learner as learner_lib
from gp_jax.serving.state import store
from gp_jax.serving.state import versions as versions_lib

# The runner's flag of each config field (experiments/serve_router.py defines them with help).
FLAGS = {
    "workdir": "workdir",
    "host": "http.host", "port": "http.port", "max_body_bytes": "http.max_body_bytes",
    "deadline_s": "http.deadline_s", "keepalive_s": "http.keepalive_s",
    "stream_write_timeout_s": "http.stream_write_timeout_s",
    "api_keys_file": "http.api_keys_file", "allowed_hosts": "http.allowed_hosts",
    "rate_limit_rps": "http.rate_limit_rps", "rate_limit_burst": "http.rate_limit_burst",
    "feedback_rps": "http.feedback_rps",
    "max_concurrency": "engine.max_concurrency", "max_queue": "engine.max_queue",
    "max_key_concurrency": "engine.max_key_concurrency",
    "default_task": "engine.default_task", "policy_thread": "engine.policy_thread",
    "memory_path": "state.memory_path", "route_log": "state.route_log",
    "route_log_segment_bytes": "state.route_log_segment_bytes",
    "route_retention": "state.route_retention",
    "memory_url": "state.memory_url", "memory_namespace": "state.memory_namespace",
    "sync_interval_s": "state.sync_interval_s", "max_key_share": "state.max_key_share",
    "memory_recover": "state.memory_recover",
    "learn": "learn.enabled", "learn_every": "learn.every", "learn_explore": "learn.explore",
    "learn_canary_size": "learn.canary_size", "learn_canary_margin": "learn.canary_margin",
    "learn_max_kl": "learn.max_kl", "learn_kl_backtrack": "learn.kl_backtrack",
    "learn_max_key_share": "learn.max_key_share", "learn_key_check_z": "learn.key_check_z",
    "learn_key_check_min": "learn.key_check_min", "learn_seed": "learn.seed",
    "sim_event": "sim_event.kind", "sim_event_llm": "sim_event.llm", "sim_event_t": "sim_event.t",
    "sim_event_delta": "sim_event.delta", "sim_event_scale": "sim_event.scale",
}
LEARN_FIELDS = ("every", "explore", "canary_size", "canary_margin", "max_kl", "kl_backtrack",
                "max_key_share", "key_check_z", "key_check_min", "seed")


@dataclasses.dataclass(frozen=True)
class HTTPSettings:
  """The HTTP layer's settings: the keyword arguments of http/app.serve."""
  host: str
  port: int
  max_body_bytes: int
  deadline_s: float
  keepalive_s: float
  keys: auth.KeyRing | None
  allowed_hosts: tuple[str, ...]
  rate_limit_rps: float
  rate_limit_burst: int
  feedback_rps: float
  stream_write_timeout_s: float = 30.0


@dataclasses.dataclass(frozen=True)
class SimEventSettings:
  """A simulated pool event to serve (kind '' = none); None fields take the drift study's."""
  kind: str
  llm: str
  t: int
  delta: float | None
  scale: float | None


@dataclasses.dataclass(frozen=True)
class ServerSettings:
  """Everything a router server is started with, validated."""
  workdir: str
  http: HTTPSettings
  max_concurrency: int
  max_queue: int | None
  default_task: str | None
  policy_thread: str
  state: dict            # the config's state section (store_config and state_dir read it)
  learn: learner_lib.LearnSettings | None
  sim_event: SimEventSettings
  max_key_concurrency: int | None = None   # places one API key may hold (None: a quarter)

  @property
  def memory_path(self) -> str | None:
    """The memory file (None: RAM only)."""
    m = self.state["memory_path"] or str(pathlib.Path(self.workdir) / "served" / "memory.npz")
    return None if m == "none" else m

  @property
  def state_dir(self) -> pathlib.Path:
    """The served-state folder: the memory's, or <workdir>/served."""
    m = self.memory_path
    return pathlib.Path(m).parent if m else pathlib.Path(self.workdir) / "served"

  def store_config(self) -> store.StoreConfig:
    m = self.memory_path
    log = self.state["route_log"] or (str(pathlib.Path(m).with_name("routes.jsonl")) if m else "")
    namespace = (self.state["memory_namespace"]
                 or pathlib.Path(self.workdir).resolve().name)
    return store.StoreConfig(memory_path=m, route_log=None if log in ("", "none") else log,
                             memory_url=self.state["memory_url"], namespace=namespace,
                             segment_bytes=int(self.state["route_log_segment_bytes"]),
                             route_retention=str(self.state["route_retention"]),
                             recover=bool(self.state["memory_recover"]))

  def session_kwargs(self) -> dict:
    """The keyword arguments of engine/session.RouterSession besides config and workdir."""
    return dict(max_concurrency=self.max_concurrency, max_queue=self.max_queue,
                max_key_concurrency=self.max_key_concurrency,
                default_task=self.default_task, policy_thread=self.policy_thread,
                store_config=self.store_config(),
                max_key_share=float(self.state["max_key_share"]),
                sync_interval_s=float(self.state["sync_interval_s"]), learn=self.learn,
                versions_dir=(self.state_dir / versions_lib.FOLDER) if self.learn is not None
                else None)


def _optional(x) -> float | None:
  return None if x is None else float(x)


def from_config(c) -> ServerSettings:
  """The settings of server config `c` (experiments/configs/serve.py's shape).

  Raises:
    ConfigError: a bad value (a non-loopback host without keys, negative limits, ...), or
      sim_event fields without sim_event.kind.
  """
  h, e = c.http, c.engine
  if not float(h.keepalive_s) > 0 or (e.max_queue is not None and int(e.max_queue) < 0):
    raise errors.ConfigError("--keepalive_s must be > 0 and --max_queue >= 0, got "
                             f"{float(h.keepalive_s):g} and {e.max_queue}")
  keys = auth.load(h.api_keys_file) if h.api_keys_file else None
  auth.check_bind(h.host, keys, config_lists.names(h.allowed_hosts))   # at once, before the start
  limits.TokenBuckets(float(h.rate_limit_rps), int(h.rate_limit_burst), what="--rate_limit_rps")
  limits.TokenBuckets(float(h.feedback_rps), int(h.rate_limit_burst), what="--feedback_rps")
  http = HTTPSettings(str(h.host), int(h.port), int(h.max_body_bytes), float(h.deadline_s),
                      float(h.keepalive_s), keys, tuple(config_lists.names(h.allowed_hosts)),
                      float(h.rate_limit_rps), int(h.rate_limit_burst), float(h.feedback_rps),
                      stream_write_timeout_s=float(h.stream_write_timeout_s))
  if not http.stream_write_timeout_s > 0 or (e.max_key_concurrency is not None
                                             and int(e.max_key_concurrency) < 0):
    raise errors.ConfigError("--stream_write_timeout_s must be > 0 and --max_key_concurrency "
                             f">= 0, got {http.stream_write_timeout_s:g} and "
                             f"{e.max_key_concurrency}")
  ev = c.sim_event
  event = SimEventSettings(str(ev.kind), str(ev.llm), int(ev.t), _optional(ev.delta),
                           _optional(ev.scale))
  if not event.kind:
    given = [f"sim_event.{k}" for k, off in (("llm", ""), ("t", 0)) if ev[k] != off]
    given += [f"sim_event.{k}" for k in ("delta", "scale") if _optional(ev[k]) is not None]
    if given:
      names = {v: k for k, v in FLAGS.items()}
      raise errors.ConfigError(f"--{', --'.join(names[g] for g in given)} need --sim_event")
  if str(e.policy_thread) not in placement.POLICY_THREADS:
    raise errors.unknown_name("--policy_thread", str(e.policy_thread), placement.POLICY_THREADS)
  learn = None
  if c.learn.enabled:
    learn = learner_lib.LearnSettings(**{k: c.learn[k] for k in LEARN_FIELDS})
    if c.state.memory_url:
      raise errors.ConfigError(
          "--learn with --memory_url is refused: router versions are kept in each replica's "
          "own folder, so learning replicas would overwrite each other's versions and a "
          "rollback would reach one of them; learn on one server with the file store "
          "(--memory_path), or run the replicas without --learn")
  return ServerSettings(str(c.workdir), http, int(e.max_concurrency),
                        None if e.max_queue is None else int(e.max_queue),
                        str(e.default_task) or None, str(e.policy_thread),
                        dict(c.state.to_dict()), learn, event,
                        None if e.max_key_concurrency is None else int(e.max_key_concurrency))
