"""Writes an `official_*.npz` parity fixture by running the authors' released PyTorch code.

  PY="$(bash scripts/setup_torch_ref.sh)"
  "$PY" tests/graph/make_official_reference.py --repo=/tmp/GraphPlanner --out=tests/graph/official_small.npz \
      --seed=0 --embed_dim=8 --hidden_dim=8 ...

The file's keys and shapes are described in docs/parity.md. `--repo` is a checkout of
github.com/ulab-uiuc/GraphPlanner; its `router_planner/dynamic_router/network.py` is run unchanged.
That file imports `torch_scatter` and `.gnn_baselines` (which needs torch_geometric); neither is
installed. It is loaded with importlib under a synthetic package, with two stand-ins present only
while it is imported:
  * `torch_scatter.scatter(src, index, dim=0, reduce="mean", dim_size=N)`: a scatter-mean written
    with index_add_ and row counts (rows no index points at stay 0, as in torch_scatter);
  * `gnn_baselines.HomoGCNDBLayer` / `HeteroGCNDBLayer`: placeholders that raise when built.
Only the `dblayer` backbone is mapped. The update's minibatch order is recorded by giving
network.py a copy of the `random` module whose shuffle records each epoch's result; each
minibatch's losses are recorded by wrapping torch.Tensor.backward while `update` runs (the
released update calls `pl.backward()` then `vl.backward()` once per minibatch), and its gradients
by wrapping the two optimizers' `step` (each parameter's .grad just before the step; a parameter
without a gradient, which Adam skips, is written as zeros). Nothing is
recomputed: every `out/*` and `upd/*` value is what the released code produced.

Runs under the torch venv (scripts/setup_torch_ref.sh); gp_jax never imports torch.
"""
import argparse
import importlib.util
import os
import random
import subprocess
import sys
import types

import numpy as np
import torch

ROLES = ("planner", "executor", "summarizer")
_PKG = "_graphplanner_released"


def _scatter_mean(src, index, dim=0, reduce="mean", dim_size=None):
  """torch_scatter.scatter for the one call network.py makes (dim 0, mean)."""
  if dim != 0 or reduce != "mean":
    raise NotImplementedError(f"stand-in scatter: dim={dim} reduce={reduce}")
  n = int(dim_size) if dim_size is not None else (int(index.max()) + 1 if index.numel() else 0)
  total = torch.zeros((n,) + tuple(src.shape[1:]), dtype=src.dtype, device=src.device)
  total.index_add_(0, index, src)
  count = torch.zeros(n, dtype=src.dtype, device=src.device)
  count.index_add_(0, index, torch.ones(index.shape[0], dtype=src.dtype, device=src.device))
  return total / count.clamp(min=1).reshape((n,) + (1,) * (src.dim() - 1))


class _UnmappedBackbone(torch.nn.Module):
  def __init__(self, *args, **kwargs):
    raise NotImplementedError("only the dblayer backbone is mapped (gnn_baselines is a stand-in)")


def load_network(repo):
  """Imports the released router_planner/dynamic_router/network.py from the checkout `repo`."""
  path = os.path.join(repo, "router_planner", "dynamic_router", "network.py")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: --repo must be a checkout of ulab-uiuc/GraphPlanner")
  name = f"{_PKG}.network"
  if name in sys.modules:
    return sys.modules[name]
  pkg = types.ModuleType(_PKG)
  pkg.__path__ = [os.path.dirname(path)]
  baselines = types.ModuleType(f"{_PKG}.gnn_baselines")
  baselines.HomoGCNDBLayer = baselines.HeteroGCNDBLayer = _UnmappedBackbone
  scatter_mod = types.ModuleType("torch_scatter")
  scatter_mod.scatter = _scatter_mean
  saved = sys.modules.get("torch_scatter")
  sys.modules.update({_PKG: pkg, baselines.__name__: baselines, "torch_scatter": scatter_mod})
  try:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  except BaseException:
    sys.modules.pop(name, None)
    raise
  finally:
    if saved is None:
      sys.modules.pop("torch_scatter", None)
    else:
      sys.modules["torch_scatter"] = saved
  return module


def source_commit(repo, fallback="unknown"):
  if os.path.exists(os.path.join(repo, ".git")):
    try:
      return subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], check=True, text=True,
                            capture_output=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
      pass
  return fallback


def action_ids(num_llms):
  """LLM_role ids as route_env builds them: f"{role}_{action index}", roles in ROLES order."""
  return [f"{ROLES[a // num_llms]}_{a}" for a in range(3 * num_llms)]


def global_tables(query_emb, llm_emb):
  """The released query table and LLM table from [Q, d] and [A, 2d] float32 arrays."""
  query = {"query.id": list(range(len(query_emb))),
           "query_embedding": [torch.tensor(r) for r in query_emb]}
  llm = {"LLM_role.id": action_ids(len(llm_emb) // 3), "embedding": [torch.tensor(r) for r in llm_emb]}
  return query, llm


def memory_table(rows, query, action, num_llms):
  """A released memory table from rows [n, 2d+2] = [n_i ; n_o ; score ; cost] and their ids."""
  d = (rows.shape[1] - 2) // 2
  ids = action_ids(num_llms)
  return {"query.id": [int(q) for q in query], "LLM_role.id": [ids[int(a)] for a in action],
          "score": rows[:, 2 * d].tolist(), "cost": rows[:, 2 * d + 1].tolist(),
          "n_i": [torch.tensor(r[:d]) for r in rows], "n_o": [torch.tensor(r[d:2 * d]) for r in rows]}


class HistoryMemory:
  """What RouteAgent.update reads the history from (train.MemoryTable's get_table)."""

  def __init__(self, table):
    self.table = table

  def get_table(self):
    return {k: list(v) for k, v in self.table.items()}


def random_rows(rng, n, d):
  """[n, 2d+2] memory rows: n_i, n_o ~ 0.5 N(0,1), score in [0,1], a small positive cost."""
  emb = 0.5 * rng.standard_normal((n, 2 * d))
  return np.concatenate([emb, rng.random((n, 1)), rng.uniform(0.001, 0.05, (n, 1))], 1).astype(np.float32)


def perturb(net, gen, scale=0.1):
  """Adds N(0, scale^2) to every LayerNorm weight/bias and every DBLayer skip_ratio."""
  with torch.no_grad():
    for name, p in net.named_parameters():
      mod = net.get_submodule(name.rsplit(".", 1)[0]) if "." in name else net
      if isinstance(mod, torch.nn.LayerNorm) or name.endswith("skip_ratio"):
        p.add_(scale * torch.randn(p.shape, generator=gen))


def state_arrays(prefix, net):
  return {f"{prefix}/{k}": v.detach().cpu().numpy().astype(np.float32) for k, v in net.state_dict().items()}


def make_inputs(args, rng):
  d, Q, A, H, B, L = (args.embed_dim, args.num_queries, 3 * args.num_llms, args.history_rows,
                      args.observations, args.local_rows)
  x = {"query_emb": (0.5 * rng.standard_normal((Q, d))).astype(np.float32),
       "llm_emb": (0.5 * rng.standard_normal((A, 2 * d))).astype(np.float32),
       "his_rows": random_rows(rng, H, d),
       "his_query": rng.integers(0, Q, H).astype(np.int32),
       "his_action": rng.integers(0, A, H).astype(np.int32)}
  count = rng.integers(0, L + 1, B)
  count[rng.permutation(B)[:max(2, B // 4)]] = 0          # several empty workflow tables
  count[np.flatnonzero(count)[:1]] = L                    # and at least one full one
  query = rng.integers(0, Q, B)
  task = rng.integers(0, args.task_classes, B)
  if args.task_classes >= 2 and B >= 2:
    task[:2] = [0, 1]
  x["local_rows"] = np.zeros((B, L, 2 * d + 2), np.float32)
  x["local_query"] = np.zeros((B, L), np.int32)
  x["local_action"] = np.zeros((B, L), np.int32)
  for i in range(B):
    x["local_rows"][i, :count[i]] = random_rows(rng, count[i], d)
    x["local_query"][i, :count[i]] = query[i]             # as in route_env: the episode's query
    x["local_action"][i, :count[i]] = rng.integers(0, A, count[i])
  x["local_count"] = count.astype(np.int32)
  x["state"] = (0.5 * rng.standard_normal((B, d))).astype(np.float32)
  x["his_index"] = np.stack([query, task], 1).astype(np.int32)
  mask = (rng.random((B, A)) > 0.35).astype(np.float32)
  mask[::3] = 1.0                                         # some rows fully valid
  for i in np.flatnonzero(mask.sum(1) == 0):
    mask[i, rng.integers(0, A)] = 1.0
  x["mask"] = mask
  return x


def build(args):
  torch.manual_seed(args.seed)
  np.random.seed(args.seed)
  random.seed(args.seed)
  rng = np.random.default_rng(args.seed)
  net = load_network(args.repo)
  cpu = torch.device("cpu")
  B, n_llms = args.observations, args.num_llms
  agent = net.RouteAgent(embed_dim=args.embed_dim, hidden_dim=args.hidden_dim, lr=args.lr, gamma=args.gamma,
                         eps_clip=args.eps_clip, k_epochs=args.k_epochs, entropy_coef=args.entropy_coef,
                         buffer_size=B, device=cpu, gnn_backbone="dblayer")
  gen = torch.Generator().manual_seed(args.seed + 1000)
  perturb(agent.policy, gen)
  perturb(agent.value, gen)
  agent.policy_old.load_state_dict(agent.policy.state_dict())
  n_cls = agent.policy.class_embedding.num_embeddings
  if n_cls != args.num_classes or not 1 <= args.task_classes <= n_cls:
    raise SystemExit(f"the released class embedding has {n_cls} rows (--num_classes={args.num_classes}, "
                     f"--task_classes={args.task_classes})")
  commit = source_commit(args.repo, args.source_commit)
  f = {"cfg/embed_dim": np.int32(args.embed_dim), "cfg/hidden_dim": np.int32(args.hidden_dim),
       "cfg/num_classes": np.int32(n_cls), "cfg/backbone": np.array("dblayer"),
       "cfg/seed": np.int32(args.seed),
       "cfg/source": np.array(f"ulab-uiuc/GraphPlanner@{commit} torch=={torch.__version__}")}
  f.update(state_arrays("sd/policy", agent.policy))
  f.update(state_arrays("sd/value", agent.value))
  x = make_inputs(args, rng)
  f.update({f"in/{k}": v for k, v in x.items()})

  query_table, llm_table = global_tables(x["query_emb"], x["llm_emb"])
  his_table = memory_table(x["his_rows"], x["his_query"], x["his_action"], n_llms)
  his_tables = {"memory_table": his_table, "query_table": query_table, "LLM_table": llm_table}
  locals_, probs, values = [], [], []
  for i in range(B):
    c = x["local_count"][i]
    locals_.append(memory_table(x["local_rows"][i, :c], x["local_query"][i, :c], x["local_action"][i, :c], n_llms))
    lt = {"memory_table": locals_[i], "query_table": query_table, "LLM_table": llm_table}
    state, hi = torch.tensor(x["state"][i:i + 1]), torch.tensor(x["his_index"][i].astype(np.int64))
    with torch.no_grad():
      probs.append(agent.policy([state], lt, his_tables, hi, torch.tensor(x["mask"][i]).unsqueeze(0))[0])
      values.append(agent.value([state], lt, his_tables, hi).reshape(()))
  f["out/probs"] = torch.stack(probs).numpy().astype(np.float32)
  f["out/value"] = torch.stack(values).numpy().astype(np.float32)

  # The buffer: transition i is observation i, its action sampled by select_action (policy_old,
  # masked and renormalised, Categorical) as in train.operate_global; value = out/value[i].
  done = np.zeros(B, np.int32)
  end = -1
  while end < B - 1:
    end += int(rng.integers(1, 5))
    if end < B - 1 or rng.random() < 0.5:
      done[min(end, B - 1)] = 1
  reward = rng.standard_normal(B).astype(np.float32)
  action, log_prob, sa_value = np.zeros(B, np.int32), np.zeros(B, np.float32), np.zeros(B, np.float32)
  for i in range(B):
    lt = {"memory_table": locals_[i], "query_table": query_table, "LLM_table": llm_table}
    state, hi = torch.tensor(x["state"][i:i + 1]), torch.tensor(x["his_index"][i].astype(np.int64))
    a, lp, v, _ = agent.select_action(state, lt, his_tables, hi, action_mask=x["mask"][i], greedy=False)
    action[i], log_prob[i], sa_value[i] = a, lp, v
    agent.store_transition(state, a, float(reward[i]), float(log_prob[i]), float(f["out/value"][i]),
                           bool(done[i]), locals_[i], [int(v) for v in x["his_index"][i]], x["mask"][i])
  assert np.all(x["mask"][np.arange(B), action] == 1), "select_action picked a masked action"

  perms, losses = [], []
  real_backward = torch.Tensor.backward

  def recording_shuffle(seq, *a, **k):
    random.shuffle(seq, *a, **k)
    perms.append(list(seq))

  def recording_backward(self, *a, **k):
    losses.append(float(self.detach()))
    return real_backward(self, *a, **k)

  grads = {"policy": [], "value": []}

  def recording_step(name, module, optimizer):
    real_step = optimizer.step

    def step(*a, **k):
      grads[name].append({n: (np.zeros(tuple(p.shape), np.float32) if p.grad is None
                              else p.grad.detach().numpy().astype(np.float32).copy())
                          for n, p in module.named_parameters()})
      return real_step(*a, **k)
    optimizer.step = step

  recording_step("policy", agent.policy, agent.policy_optimizer)
  recording_step("value", agent.value, agent.value_optimizer)
  proxy = types.ModuleType("random")
  proxy.__dict__.update(random.__dict__)
  proxy.shuffle = recording_shuffle
  net.random, torch.Tensor.backward = proxy, recording_backward
  try:
    pl, vl, ent = agent.update(query_table, llm_table, HistoryMemory(his_table), args.batch_size)
  finally:
    net.random, torch.Tensor.backward = random, real_backward
  n_batches = args.k_epochs * -(-B // args.batch_size)
  assert len(perms) == args.k_epochs and len(losses) == 2 * n_batches, (len(perms), len(losses))
  assert np.isclose(np.mean(losses[0::2]), pl) and np.isclose(np.mean(losses[1::2]), vl)
  f.update({"upd/action": action, "upd/reward": reward, "upd/log_prob": log_prob, "upd/value": f["out/value"],
            "upd/done": done, "upd/perm": np.array(perms, np.int32),
            "upd/lr": np.float32(args.lr), "upd/gamma": np.float32(args.gamma),
            "upd/eps_clip": np.float32(args.eps_clip), "upd/entropy_coef": np.float32(args.entropy_coef),
            "upd/gae_lambda": np.float32(0.85), "upd/k_epochs": np.int32(args.k_epochs),
            "upd/batch_size": np.int32(args.batch_size), "upd/policy_loss": np.float32(pl),
            "upd/value_loss": np.float32(vl), "upd/entropy": np.float32(ent),
            "upd/policy_loss_steps": np.array(losses[0::2], np.float32),
            "upd/value_loss_steps": np.array(losses[1::2], np.float32)})
  for name, steps in grads.items():
    assert len(steps) == n_batches, (name, len(steps))
    f.update({f"upd/grad/{name}/{k}": np.stack([g[k] for g in steps]) for k in steps[0]})
  f.update(state_arrays("upd/sd/policy", agent.policy))
  f.update(state_arrays("upd/sd/value", agent.value))
  info = {"sa_value_gap": float(np.abs(sa_value - f["out/value"]).max()), "commit": commit}
  return f, info


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repo", required=True, help="checkout of ulab-uiuc/GraphPlanner")
  ap.add_argument("--out", required=True)
  ap.add_argument("--source_commit", default="unknown", help="used when --repo has no .git")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--embed_dim", type=int, default=8)
  ap.add_argument("--hidden_dim", type=int, default=8)
  ap.add_argument("--num_queries", type=int, default=5)
  ap.add_argument("--num_llms", type=int, default=2, help="actions A = 3 * num_llms")
  ap.add_argument("--history_rows", type=int, default=20)
  ap.add_argument("--observations", type=int, default=12)
  ap.add_argument("--local_rows", type=int, default=4)
  ap.add_argument("--task_classes", type=int, default=2)
  ap.add_argument("--num_classes", type=int, default=11)
  ap.add_argument("--k_epochs", type=int, default=2)
  ap.add_argument("--batch_size", type=int, default=32)
  ap.add_argument("--lr", type=float, default=1e-4)
  ap.add_argument("--gamma", type=float, default=0.98)
  ap.add_argument("--eps_clip", type=float, default=0.2)
  ap.add_argument("--entropy_coef", type=float, default=0.01)
  args = ap.parse_args(argv)
  if args.observations < 2 or args.local_rows < 1:
    raise SystemExit("--observations must be >= 2 (advantages are normalised) and --local_rows >= 1")
  f, info = build(args)
  np.savez_compressed(args.out, **f)
  moved = [k[len("upd/sd/"):] for k in f if k.startswith("upd/sd/")
           if not np.array_equal(f[k], f[k[len("upd/"):]])]
  print(f"wrote {args.out} ({os.path.getsize(args.out) / 1024:.0f} KiB, {len(f)} arrays): "
        f"d={args.embed_dim} h={args.hidden_dim} Q={args.num_queries} A={3 * args.num_llms} "
        f"H={args.history_rows} B={args.observations} L={args.local_rows} seed={args.seed} "
        f"losses(pl,vl,ent)=({f['upd/policy_loss']:.5g},{f['upd/value_loss']:.5g},{f['upd/entropy']:.5g}) "
        f"tensors changed by the update={len(moved)}/{sum(k.startswith('sd/') for k in f)} "
        f"select_action value gap={info['sa_value_gap']:.2g} commit={info['commit'][:12]}")


if __name__ == "__main__":
  main()
