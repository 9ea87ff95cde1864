"""Serves a trained router over an OpenAI-compatible API (docs/serving.md).

  python -m experiments.serve_router --workdir=workdirs/alpha0.5 --port=8080 \
      --memory_path=workdirs/alpha0.5/served/memory.npz
  python -m experiments.serve_router --workdir=workdirs/alpha0.5 --port=8080 \
      --memory_url=postgresql://router@db/gp_jax      # replicas sharing one memory

The workdir's recorded config and best checkpoint define the router; --config.* may change only
where the backbones are (--config.backend=endpoints --config.endpoints_file=...), timeouts, caches
and sampling.max_tokens. Default backend: the embedded simulator, as the run was trained.

The server's own settings are one config, --serve_config (default experiments/configs/serve.py,
read into gp_jax/serving/settings.ServerSettings); every flag below overrides its field.
Anything but a loopback --host needs --api_keys_file (docs/serving.md, Keys, limits and metrics).
"""

from absl import flags
from ml_collections import config_flags

from experiments import common
from experiments import serve_router_process
from gp_jax import files
from gp_jax.serving.engine import config as served_config
from gp_jax.serving.engine import session as session_lib
from gp_jax.serving import settings as settings_lib
from gp_jax.serving.http import app as app_lib
from gp_jax.sim import served_events
from gp_jax.util import config_overrides

_CONFIG = common.define_config("experiments/configs/default.py",
                               "Only --config.* overrides are read (the workdir's config.json is "
                               "the config); see gp_jax/serving/engine/config.SERVE_OVERRIDABLE.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/alpha0.5", "Workdir of a training run.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to listen on.")
_PORT = flags.DEFINE_integer("port", 8080, "Port (0: a free one, printed at start).")
_MAX_CONCURRENCY = flags.DEFINE_integer("max_concurrency", 64,
                                        "Requests whose workflows run at once; more wait.")
_MEMORY_PATH = flags.DEFINE_string("memory_path", "",
                                   "History memory file (base + .journal), restored at start; "
                                   "feedback is journaled and fsynced before it is acknowledged "
                                   "('' = <workdir>/served/memory.npz; 'none' = RAM only). Its "
                                   "folder is locked: one server per memory.")
_ROUTE_LOG = flags.DEFINE_string("route_log", "",
                                 "Route log (JSONL) of served requests and feedback ('' = "
                                 "routes.jsonl next to the memory file; 'none' = RAM only).")
_SEGMENT = flags.DEFINE_integer("route_log_segment_bytes", 256 << 20,
                                "The route log rolls over to a new segment (routes.2.jsonl, ...) "
                                "before one would grow past this many bytes.")
_RETENTION = flags.DEFINE_string("route_retention", "",
                                 "Route-log segments kept: '' keeps all; an age (7d, 12h), a total "
                                 "size (10GiB, 500MiB) or both ('7d,10GiB'). Older closed segments "
                                 "are removed at rollover and at start; the active one is kept.")
_MEMORY_URL = flags.DEFINE_string("memory_url", "",
                                  "postgresql://... : memory, feedback ids and route log in "
                                  "PostgreSQL, shared by replicas ('' = the file store at "
                                  "--memory_path).")
_NAMESPACE = flags.DEFINE_string("memory_namespace", "",
                                 "Name under which replicas of one router share PostgreSQL rows "
                                 "('' = the workdir's folder name).")
_SYNC = flags.DEFINE_float("sync_interval_s", 1.0,
                           "How often a replica applies feedback other replicas added (the bound "
                           "on how late it reaches this replica's decisions).")
_MAX_KEY_SHARE = flags.DEFINE_float("max_key_share", 0.25,
                                    "Fraction of the memory capacity one API key's served rows "
                                    "may hold (its own oldest go first); training rows and "
                                    "feedback without keys are not capped.")
_RECOVER = flags.DEFINE_bool("memory_recover", False,
                             "Start past a damaged memory journal record: the journal is kept "
                             "as <journal>.damaged-<time> and the memory starts from the base "
                             "and the records before the damage (docs/serving.md).")
_DEFAULT_TASK = flags.DEFINE_string("default_task", "",
                                    "Task family of requests without metadata.task ('' = mmlu "
                                    "on the simulator, the first training task otherwise).")
_POLICY_THREAD = flags.DEFINE_enum("policy_thread", "auto", ["auto", "loop", "thread"],
                                   "Where the batched policy calls run: the event loop, the "
                                   "compute thread, or auto (the loop when the largest batch's "
                                   "call takes at most 2 ms at start; /health says which).")
_MAX_QUEUE = flags.DEFINE_integer("max_queue", None,
                                  "Requests that may wait for a workflow slot (default 4 x "
                                  "--max_concurrency); more get 429 with Retry-After at once.")
_KEEPALIVE = flags.DEFINE_float("keepalive_s", 5.0,
                                "A stream sends an SSE keep-alive comment this often while the "
                                "workflow runs.")
_WRITE_TIMEOUT = flags.DEFINE_float("stream_write_timeout_s", 30.0,
                                    "A stream whose client does not take its bytes within this "
                                    "many seconds is cut off: its connection is aborted (dropping "
                                    "what was buffered for it) and its workflow cancelled.")
_MAX_KEY_CONCURRENCY = flags.DEFINE_integer("max_key_concurrency", None,
                                            "Requests one API key may have running or waiting "
                                            "at once (default a quarter of --max_concurrency, at "
                                            "least 1; 0 = no cap); one more gets 429 with "
                                            "Retry-After. Waiting requests get slots round "
                                            "robin by key.")
_MAX_BODY = flags.DEFINE_integer("max_body_bytes", 1 << 20, "Larger request bodies get 413.")
_DEADLINE = flags.DEFINE_float("deadline_s", 600.0, "A request unanswered after this gets 504.")
_KEYS = flags.DEFINE_string("api_keys_file", "",
                            'API keys, JSON {"keys": [{"name", "sha256", "role": "client" | '
                            '"admin", "feedback": true | false}]}, re-read on SIGHUP and when '
                            'it changes (\'\' = no keys: loopback --host and --allowed_hosts '
                            'only).')
_ALLOWED_HOSTS = flags.DEFINE_list("allowed_hosts", [],
                                   "Host header names served besides --host and the loopback "
                                   "names ('*' = any, behind a proxy that checks Host).")
_RATE = flags.DEFINE_float("rate_limit_rps", 0.0, "Requests per second per key (per client "
                           "address without keys); 0 = no limit.")
_BURST = flags.DEFINE_integer("rate_limit_burst", 20, "Token bucket size of the request and "
                              "feedback limits (requests at once after an idle while).")
_LEARN = flags.DEFINE_bool("learn", False, "Learn while serving: PPO updates from served "
                           "requests' feedback, guarded, swapped in between decisions; router "
                           "versions kept next to the memory (docs/serving.md, Learning while "
                           "serving). Simulator backend only.")
_LEARN_EVERY = flags.DEFINE_integer("learn_every", 32, "Feedbacks per online PPO update.")
_LEARN_EXPLORE = flags.DEFINE_float("learn_explore", 0.1, "Share of requests whose decisions are "
                                    "sampled from the policy (the rest greedy).")
_LEARN_CANARY = flags.DEFINE_integer("learn_canary_size", 16, "Held-out simulator queries a "
                                     "candidate is scored on.")
_LEARN_MARGIN = flags.DEFINE_float("learn_canary_margin", 0.02, "A candidate whose canary reward "
                                   "is below the serving one by more is rejected.")
_LEARN_KL = flags.DEFINE_float("learn_max_kl", 0.05, "Largest mean KL(serving || candidate) of "
                               "one update.")
_LEARN_BACKTRACK = flags.DEFINE_integer("learn_kl_backtrack", 3, "Halvings of an update's "
                                         "step tried when it is past --learn_max_kl (0: refuse "
                                         "it outright).")
_LEARN_SHARE = flags.DEFINE_float("learn_max_key_share", 0.25, "Largest share of one update's "
                                  "episodes from one API key.")
_LEARN_KEY_Z = flags.DEFINE_float("learn_key_check_z", 3.09, "Consistency check: a key whose "
                                   "scores follow the router's value estimates less than the "
                                   "other keys' by more than this z (Fisher) is left out of "
                                   "updates; 0 = off.")
_LEARN_KEY_MIN = flags.DEFINE_integer("learn_key_check_min", 32, "Feedbacks a key needs before "
                                      "the consistency check may leave it out.")
_LEARN_SEED = flags.DEFINE_integer("learn_seed", 0, "Seed of the learner and the exploring "
                                   "decisions.")
_SIM_EVENT = flags.DEFINE_string("sim_event", "", f"{' | '.join(served_events.KINDS)}: serve "
                                 "with a simulated pool event (simulator only): the drift "
                                 "study's event at request --sim_event_t of the training-query "
                                 "stream (docs/serving.md, Served pool events); '' = none.")
_SIM_EVENT_LLM = flags.DEFINE_string("sim_event_llm", "", "The event's LLM ('' = the drift "
                                     "study's, config.study.drift_llm of "
                                     "experiments/configs/study.py).")
_SIM_EVENT_T = flags.DEFINE_integer("sim_event_t", 0, "First training-query position (served "
                                    "request of a client replaying the stream) the event acts on.")
_SIM_EVENT_DELTA = flags.DEFINE_float("sim_event_delta", None, "quality_drop: logit added to the "
                                      "LLM's skill (default the drift study's drift_delta).")
_SIM_EVENT_SCALE = flags.DEFINE_float("sim_event_scale", None, "price_rise: multiplier of the "
                                      "LLM's prices (default the drift study's drift_price_scale).")
_FEEDBACK_RPS = flags.DEFINE_float("feedback_rps", 0.0, "Feedback per second per key (per "
                                   "client address without keys); 0 = no limit.")


_SERVE_CONFIG = flags.DEFINE_string("serve_config", "experiments/configs/serve.py",
                                    "The server's settings (a Python file with get_config()); "
                                    "the flags above override its fields.")


def _server_config():
  """The --serve_config file's config with every flag given on the command line applied."""
  given = {field: flags.FLAGS[flag].value for flag, field in settings_lib.FLAGS.items()
           if flags.FLAGS[flag].present}
  if "http.allowed_hosts" in given:   # a list flag; the config field is a comma list
    given["http.allowed_hosts"] = ",".join(given["http.allowed_hosts"])
  return config_overrides.apply(common.load_config_file(_SERVE_CONFIG.value, "--serve_config"),
                                given)


def _served_event(ev: settings_lib.SimEventSettings) -> served_events.ServedEvent | None:
  """The served pool event, with the drift study's settings where not given (None: no event)."""
  if not ev.kind:
    return None
  return serve_router_process.drift_event(ev.kind, ev.t, ev.llm, ev.delta, ev.scale)


@common.user_errors_exit_2
def main(argv):
  del argv
  settings = settings_lib.from_config(_server_config())   # refused here, before the slow start
  overrides = config_flags.get_override_values(flags.FLAGS["config"])
  config = served_config.load_config(settings.workdir, overrides)
  event = _served_event(settings.sim_event)
  if event is not None:
    config = served_config.with_pool_event(config, event)
  state_dir = settings.state_dir
  if settings.learn is not None:
    # The settings a learning server ran with, in its served-state folder.
    files.write_json(state_dir / "learn.json", settings.learn.to_dict(), "the learning settings")
  if event is not None:   # the pool this server's outcomes came from, next to its memory
    files.write_json(state_dir / served_events.FILE, event.to_dict(), "the served pool event")
  s = session_lib.RouterSession(config, settings.workdir, **settings.session_kwargs())
  app_lib.serve(s, **vars(settings.http))   # shallow: the key ring is handed over as it is


if __name__ == "__main__":
  common.run(main)
