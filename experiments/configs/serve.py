"""The router server's settings (experiments/serve_router.py; gp_jax/serving/settings.py).

  python -m experiments.serve_router --serve_config=experiments/configs/serve.py \
      --workdir=workdirs/alpha0.5 --port=8080

Every field has a command-line flag of the runner that overrides it (FLAGS in
gp_jax/serving/settings.py names the flag of each field; the runner's --help says what each
does). The served router itself (its config and weights) is the workdir's; only where its
backbones are and how long to wait for them may change when serving (--config.*).
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.workdir = "workdirs/alpha0.5"          # the training run served

  c.http = ml_collections.ConfigDict()
  c.http.host = "127.0.0.1"                # anything but loopback needs api_keys_file
  c.http.port = 8080                       # 0: a free one, printed at start
  c.http.max_body_bytes = 1 << 20          # larger request bodies get 413
  c.http.deadline_s = 600.0                # a request unanswered after this gets 504
  c.http.keepalive_s = 5.0                 # SSE keep-alive comment period of a stream
  c.http.stream_write_timeout_s = 30.0     # a stream whose client takes no bytes this long ends
  c.http.api_keys_file = ""                # JSON keys file ('' = no keys: loopback only)
  c.http.allowed_hosts = ""                # comma list of extra Host names ('*' = any)
  c.http.rate_limit_rps = 0.0              # requests per second per key (0 = no limit)
  c.http.rate_limit_burst = 20             # token bucket size of the request and feedback limits
  c.http.feedback_rps = 0.0                # feedback per second per key (0 = no limit)

  c.engine = ml_collections.ConfigDict()
  c.engine.max_concurrency = 64            # requests whose workflows run at once
  c.engine.max_queue = None                # requests waiting for a slot (None: 4 x max_concurrency)
  c.engine.max_key_concurrency = None      # places one key may hold (None: 1/4 of max_concurrency)
  c.engine.default_task = ""               # task of requests without metadata.task ('' = auto)
  c.engine.policy_thread = "auto"          # where policy calls run: auto | loop | thread

  c.state = ml_collections.ConfigDict()
  c.state.memory_path = ""                 # '' = <workdir>/served/memory.npz; 'none' = RAM only
  c.state.route_log = ""                   # '' = routes.jsonl beside the memory; 'none' = RAM
  c.state.route_log_segment_bytes = 256 << 20
  c.state.route_retention = ""             # route-log segments kept: '' all; 7d, 10GiB, 7d,10GiB
  c.state.memory_url = ""                  # postgresql://... : the store replicas share
  c.state.memory_namespace = ""            # replicas' shared name ('' = the workdir's name)
  c.state.sync_interval_s = 1.0            # how often other replicas' feedback is applied
  c.state.max_key_share = 0.25             # share of the memory one key's served rows may hold
  c.state.memory_recover = False           # start past a damaged journal record

  c.learn = ml_collections.ConfigDict()
  c.learn.enabled = False                  # learn while serving (simulator backend only)
  c.learn.every = 32
  c.learn.explore = 0.1
  c.learn.canary_size = 16
  c.learn.canary_margin = 0.02
  c.learn.max_kl = 0.05
  c.learn.kl_backtrack = 3
  c.learn.max_key_share = 0.25
  c.learn.key_check_z = 3.09
  c.learn.key_check_min = 32
  c.learn.seed = 0

  c.sim_event = ml_collections.ConfigDict()
  c.sim_event.kind = ""                    # quality_drop | price_rise | fail ('' = none)
  c.sim_event.llm = ""                     # '' = the drift study's drift_llm
  c.sim_event.t = 0                        # first training-query position it acts on
  c.sim_event.delta = None                 # quality_drop's logit (None = the drift study's)
  c.sim_event.scale = None                 # price_rise's multiplier (None = the drift study's)
  return c
