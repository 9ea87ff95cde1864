"""Builds the parts of a GraphPlanner run from a config: pool, action space, MDP, data, features.

Library functions elsewhere take explicit keyword arguments; this is the one place that reads the
config tree, and it validates every value it reads (ConfigError with the field's name).
"""
from __future__ import annotations

import dataclasses

from gp_jax import config_lists
from gp_jax import errors
from gp_jax.graph import features as features_lib
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import events as sim_events
from gp_jax.sim import world as world_lib
from gp_jax.sim import simulator as sim
from gp_jax.text import encoder as encoder_lib
from gp_jax.types import Query
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import roles as roles_lib

SIM_ANSWER_FORMAT = "End your reply with 'Answer: <number>'."


@dataclasses.dataclass
class System:
  catalog: catalog_lib.Catalog
  space: mdp.ActionSpace
  mdp_cfg: mdp.MDPConfig
  pool: base.LLMPool
  world: sim.SimWorld | None        # set for the simulator backend
  train_queries: list[Query]
  test_queries: list[Query]
  describe: env_lib.Describe
  scorer: env_lib.Scorer
  encoder: encoder_lib.TextEncoder
  featurizer: features_lib.Featurizer

  sampling: base.SamplingParams = base.SamplingParams()

  @property
  def simulated(self) -> bool:
    """Whether the simulator answers the calls (directly or through a replay cache recording it):
    only then do its expected utility and exact optimum describe the answers. Training (the
    "expected" reward) and every evaluation decide with this one test; with real backends on
    simulated queries (backend=endpoints, data.source=simulated) it is False."""
    return self.world is not None and _serves_simulator(self.pool)

  def env(self, alpha: float, reward: str = "sampled") -> env_lib.WorkflowEnv:
    """The routing environment. reward: "sampled" (the scored final answer) or "expected"
    (simulator only: E[U | the calls made], the same objective in expectation with less noise) or
    "auto" (expected on the simulator, sampled otherwise)."""
    if reward not in ("sampled", "expected", "auto"):
      raise errors.ConfigError(f"reward must be 'sampled', 'expected' or 'auto', got {reward!r}")
    simulated = self.simulated
    if reward == "auto":
      reward = "expected" if simulated else "sampled"
    expected = None
    if reward == "expected":
      if not simulated:
        raise errors.ConfigError("reward 'expected' needs the simulator backend (real answers "
                                 "have no known success probability); use 'sampled'")
      world = self.world
      expected = lambda state: sim.expected_utility(world, state)
    return env_lib.WorkflowEnv(self.space, self.mdp_cfg, self.pool, alpha=alpha,
                               describe=self.describe, scorer=self.scorer, sampling=self.sampling,
                               expected_utility=expected, llm_mask=self.llm_mask())

  def with_pool_events(self, events: sim_events.PoolEvents | None) -> "System":
    """This system with its simulated pool under `events` instead of the configured ones (the
    same queries, featurizer and action space). Raises ConfigError unless the simulator answers
    the calls directly (a replay cache is keyed by messages, which events do not change)."""
    if self.world is None or not isinstance(self.pool, sim.SimulatorPool):
      raise errors.ConfigError("other pool events need the simulator backend without a replay "
                               "cache")
    world = self.world.with_events(events)
    return dataclasses.replace(self, world=world,
                               pool=sim.SimulatorPool(self.catalog, self.space.roles, world))

  def llm_mask(self) -> env_lib.LLMMask | None:
    """The LLMs present at an episode's query under the simulator's join events (None: all)."""
    events = self.world.events if self.world is not None else None
    if events is None or not events.has_joins():
      return None
    world, llms = self.world, self.space.llms
    return lambda state: events.present_mask(llms, world.lookup(state.nodes[0].text).key)


def _serves_simulator(pool) -> bool:
  """True when the calls are answered by the simulator (directly or through a replay cache)."""
  while pool is not None and not isinstance(pool, sim.SimulatorPool):
    pool = getattr(pool, "inner", None)
  return pool is not None


def select_llms(catalog: catalog_lib.Catalog, spec: str) -> list[str]:
  if spec == "train":
    return catalog_lib.training_names(catalog)
  if spec == "all":
    return catalog.names
  names = list(config_lists.names(spec, "llms"))
  catalog_lib.check_names(catalog, names)
  return names


def mdp_config(c) -> mdp.MDPConfig:
  cfg = mdp.MDPConfig(p_max=int(c.p_max), max_width=int(c.max_width), max_depth=int(c.max_depth),
                      step_cap=int(c.step_cap), phase1_depth=int(c.phase1_depth),
                      phase1_width=int(c.phase1_width))
  cfg.validate()
  return cfg


def sim_describe(q: Query) -> tuple[str, str]:
  return sim.TASKS[q.task_name][1], SIM_ANSWER_FORMAT


@dataclasses.dataclass
class _Data:
  """The queries of a run and how their prompts and answers are made (one data source)."""
  world: sim.SimWorld | None
  train: list[Query]
  test: list[Query]
  describe: env_lib.Describe
  scorer: env_lib.Scorer


def full_catalog(config) -> catalog_lib.Catalog:
  """The whole LLM catalog of a config (config.catalog_file, default the paper's pool)."""
  return catalog_lib.load_catalog(config.catalog_file or catalog_lib.DEFAULT_POOL_FILE)


def configured_llms(config) -> list[str]:
  """The names config.llms selects from the config's catalog."""
  return select_llms(full_catalog(config), config.llms)


def build(config, *, pool: base.LLMPool | None = None) -> System:
  """All parts of a run. `pool` overrides the configured backend (tests, replay wrappers)."""
  full = full_catalog(config)
  llms = select_llms(full, config.llms)
  catalog = full.select(llms)
  roles = roles_lib.load_roles().select(list(config_lists.names(config.roles, "roles")))
  roles_lib.validate_role_selection(roles)
  space = mdp.ActionSpace(roles, tuple(llms))
  cfg = _checked_mdp(config, roles)
  data = _data(config, catalog, _events(config, llms))
  pool = _pool(config, catalog, roles, data.world, llms, pool)
  encoder, featurizer = _featurizer(config, catalog, space, cfg)
  return System(catalog, space, cfg, pool, data.world, data.train, data.test, data.describe,
                data.scorer, encoder, featurizer, _sampling(config))


def _checked_mdp(config, roles: roles_lib.RoleSet) -> mdp.MDPConfig:
  """config.mdp, whose step cap must hold a complete workflow of these roles."""
  cfg = mdp_config(config.mdp)
  need = cfg.max_calls(thinker=bool(roles.indices_of_kind("thinker")),
                       verifier=bool(roles.indices_of_kind("verifier")))
  if cfg.step_cap < need:
    raise errors.ConfigError(f"config.mdp.step_cap={cfg.step_cap} is below the {need} calls a "
                             "complete workflow may need with these settings")
  return cfg


def _events(config, llms: list[str]) -> sim_events.PoolEvents | None:
  """The simulated pool's events of config.data.sim_events (None: every event is off)."""
  events = sim_events.from_config(config.data.sim_events, llms=llms,
                                  domains={v[0] for v in sim.TASKS.values()}, tasks=sim.TASKS)
  if events is not None and (config.data.source != "simulated" or config.backend != "simulator"):
    raise errors.ConfigError("config.data.sim_events change the simulated pool: they need "
                             "data.source='simulated' and backend='simulator'")
  if events is not None and config.replay.mode != "off":
    raise errors.ConfigError("config.data.sim_events cannot be used with a replay cache: it is "
                             "keyed by the messages, and the events change the answers to the same "
                             "messages; set replay.mode='off'")
  return events


def _data(config, catalog: catalog_lib.Catalog, events) -> _Data:
  """The queries of config.data.source: the simulated world's, or the prepared task files'."""
  if config.data.source == "simulated":
    return _simulated_data(config, catalog, events)
  if config.data.source == "files":
    if world_lib.from_config(config.get("sim")) is not None:
      raise errors.ConfigError("config.sim.world='v2' shapes simulated queries; it needs "
                               "data.source='simulated'")
    return _file_data(config)
  raise errors.ConfigError(f"config.data.source must be 'simulated' or 'files', got "
                           f"{config.data.source!r}")


def _task_names(value: str, field: str) -> list[str]:
  """Simulated task names of a data.tasks-like field: seen, unseen, all, or a list."""
  return ({"seen": sim.SEEN_TASKS, "unseen": sim.UNSEEN_TASKS, "all": list(sim.TASKS)}.get(value)
          or list(config_lists.names(value, field)))


def _simulated_data(config, catalog: catalog_lib.Catalog, events) -> _Data:
  world = sim.SimWorld(sim.load_profiles(catalog),
                       unique_texts=bool(config.data.sim_unique_texts),
                       events=events, params=world_lib.from_config(config.get("sim")))
  tasks = _task_names(config.data.tasks, "data.tasks")
  test_tasks = (_task_names(config.data.test_tasks, "data.test_tasks")
                if config.data.test_tasks else tasks)
  if int(config.data.n_train) < 1 or int(config.data.n_test) < 1:
    raise errors.ConfigError("config.data.n_train and n_test must be >= 1")
  train = world.sample_queries(int(config.data.n_train), seed=config.seed, split="train", tasks=tasks)
  test = world.sample_queries(int(config.data.n_test), seed=config.seed, split="test", tasks=test_tasks)
  return _Data(world, train, test, sim_describe, sim.sim_score)


def _file_data(config) -> _Data:
  from gp_jax import tasks as tasks_lib   # the real benchmark tasks
  if not config.data.train_file or not config.data.test_file:
    raise errors.ConfigError("config.data.source='files' needs data.train_file and data.test_file "
                             "(written by experiments/prepare_data.py)")
  train = tasks_lib.load_queries(config.data.train_file)
  test = tasks_lib.load_queries(config.data.test_file)
  if config.data.n_train:
    train = train[:int(config.data.n_train)]
  if config.data.n_test:
    test = test[:int(config.data.n_test)]
  # The root node's text is the question as the LLMs see it (options listed, code signature...).
  originals: dict[str, Query] = {}
  def rendered(qs):
    out = []
    for q in qs:
      r = dataclasses.replace(q, query=tasks_lib.render_question(q))
      originals[r.qid] = q
      out.append(r)
    return out
  train, test = rendered(train), rendered(test)
  def describe(q):
    f = tasks_lib.prompt_fields(originals.get(q.qid, q))
    return f["task_description"], f["answer_format"]
  scorer = lambda pred, q: tasks_lib.score(pred or "", originals.get(q.qid, q))
  return _Data(None, train, test, describe, scorer)


def _pool(config, catalog: catalog_lib.Catalog, roles: roles_lib.RoleSet,
          world: sim.SimWorld | None, llms: list[str], pool: base.LLMPool | None) -> base.LLMPool:
  """The backend of config.backend (unless `pool` is given), behind config.replay's cache."""
  replay_only = config.replay.mode == "read-only"
  if pool is None and not replay_only:   # offline replay: no backend is built or probed
    pool = _backend(config, catalog, roles, world, llms)
  if config.replay.mode != "off":
    from gp_jax.llm import replay    # response cache: record, or re-run offline bit for bit
    if not config.replay.path:
      raise errors.ConfigError("config.replay.mode needs config.replay.path")
    pool = replay.ReplayPool(None if replay_only else pool,
                             config.replay.path, config.replay.mode, catalog=catalog)
  return pool


def _backend(config, catalog: catalog_lib.Catalog, roles: roles_lib.RoleSet,
             world: sim.SimWorld | None, llms: list[str]) -> base.LLMPool:
  if config.backend == "simulator":
    if world is None:
      raise errors.ConfigError("the simulator backend needs config.data.source='simulated'")
    return sim.SimulatorPool(catalog, roles, world)
  if config.backend == "endpoints":
    if not config.endpoints_file:
      raise errors.ConfigError("config.backend='endpoints' needs config.endpoints_file")
    from gp_jax.llm import openai_pool   # real OpenAI-compatible servers (vLLM)
    pool = openai_pool.OpenAIPool(catalog, config.endpoints_file, check=True,
                                  timeout_s=float(config.request_timeout_s))
    missing = [m for m in llms if m not in pool.endpoints]
    if missing:
      raise errors.ConfigError(f"{config.endpoints_file} serves no endpoint for {missing}; "
                               f"serve them or drop them from config.llms")
    return pool
  raise errors.ConfigError(f"config.backend must be 'simulator' or 'endpoints', got "
                           f"{config.backend!r}")


def _featurizer(config, catalog: catalog_lib.Catalog, space: mdp.ActionSpace,
                cfg: mdp.MDPConfig) -> tuple[encoder_lib.TextEncoder, features_lib.Featurizer]:
  """The text encoder of config.text and the featurizer of the routing MDP's observations."""
  cache = config.text.cache or None
  enc_kw = dict(dim=int(config.text.dim))
  if config.text.encoder == "vllm_embed":
    if not config.text.base_url or not config.text.model:
      raise errors.ConfigError("config.text.encoder='vllm_embed' needs config.text.base_url and "
                               "config.text.model")
    enc_kw = dict(base_url=config.text.base_url, model=config.text.model)
  encoder = encoder_lib.make_encoder(config.text.encoder, cache_path=cache, **enc_kw)
  spec = features_lib.FeatureSpec(text_dim=encoder.dim, mem_proj=int(config.model.mem_proj),
                                  max_rows=cfg.step_cap, num_actions=space.size)
  featurizer = features_lib.Featurizer(spec, encoder, space,
                                       {m.name: m.description for m in catalog.llms}, cfg,
                                       seed=config.seed)
  return encoder, featurizer


def _sampling(config) -> base.SamplingParams:
  if config.sampling.max_tokens < 1 or config.sampling.temperature < 0:
    raise errors.ConfigError("config.sampling needs max_tokens >= 1 and temperature >= 0")
  return base.SamplingParams(temperature=float(config.sampling.temperature),
                             max_tokens=int(config.sampling.max_tokens))
