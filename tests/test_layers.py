"""The layering of gp_jax, checked from the source's imports (every import statement, including
function-local ones): arrows run down only, and the import graph has no circle.

Layers, bottom to top (docs/architecture in README's layout table):
  0  root modules (errors, paths, types, files, progress) and util/
  1  llm/ (backends), text/ (encoders), tasks/ (task data, metrics, sandbox)
  2  workflow/ (MDP, roles, prompts, env, reward, fixed policies)
  3  graph/ (GARNet, features, history memory), sim/ (the simulated world)
  4  rl/ (the PPO learner)
  5  baselines/ (routers), counselor/ (Graph Counselor)
  6  runs/ (assembles systems from configs and runs experiments)
  7  serving/ (the served router: http/, engine/, state/, learning/)
A module imports from its own package (same top-level folder of gp_jax) or from a lower layer;
the two layer-0 packages (root modules and util/) import each other and nothing above them, and
the circle test holds for every module. The checker itself is tested on made-up import graphs
that it must reject.
Beyond that: graph/ and rl/ never import llm/ (the learner reaches LLMs only through the workflow
environment), nothing in gp_jax/ imports experiments/, and serving/ never imports a study (gp_jax.runs.studies):
the product server may assemble a router with runs/system.py, never run research.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = {
    "": 0, "util": 0,
    "llm": 1, "text": 1, "tasks": 1,
    "workflow": 2,
    "graph": 3, "sim": 3,
    "rl": 4,
    "baselines": 5, "counselor": 5,
    "runs": 6,
    "serving": 7,
}
NEVER = {"graph": {"llm", "sim", "runs"}, "rl": {"llm", "sim", "runs"},
         "llm": {"workflow", "graph", "rl", "sim"}}


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted((ROOT / "gp_jax").rglob("*.py"))}


def _imports(name: str, path: pathlib.Path, known) -> set[str]:
  """Modules of gp_jax (or experiments) that `name` imports anywhere in its source."""
  is_pkg = path.name == "__init__.py"
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        pkg = name.split(".") if is_pkg else name.split(".")[:-1]
        pkg = pkg[:len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
      continue
    out |= {t for t in targets if t.split(".")[0] in ("gp_jax", "experiments")}
  out.discard(name)
  return out


def _package(module: str) -> str:
  parts = module.split(".")
  if parts[0] != "gp_jax":
    return parts[0]
  return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""


def _graph():
  mods = _modules()
  return mods, {m: _imports(m, p, mods) for m, p in mods.items()}


def test_every_package_has_a_layer():
  mods, _ = _graph()
  unknown = sorted({_package(m) for m in mods} - set(LAYERS))
  assert not unknown, f"packages without a layer in tests/test_layers.py: {unknown}"


def _against_layering(graph: dict[str, set[str]]) -> list[str]:
  """Every import of `graph` (module -> modules it imports) that breaks the layering."""
  bad = []
  for mod, deps in sorted(graph.items()):
    src = _package(mod)
    for dep in sorted(deps):
      dst = _package(dep)
      if dst == "experiments":
        bad.append(f"{mod} -> {dep} (the library never imports the runners)")
      elif src == "serving" and dep.startswith("gp_jax.runs.studies"):
        bad.append(f"{mod} -> {dep} (serving/ never imports a study)")
      elif dst in NEVER.get(src, ()):
        bad.append(f"{mod} -> {dep} ({src}/ never imports {dst}/)")
      elif dst != src and LAYERS[dst] >= LAYERS[src] and not LAYERS[src] == LAYERS[dst] == 0:
        bad.append(f"{mod} -> {dep} (layer {LAYERS[src]} importing layer {LAYERS[dst]})")
  return bad


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The import circles of `graph`: its strongly connected components of two or more modules."""
  index, low, stack, on_stack, circles = {}, {}, [], set(), []

  def visit(v):   # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in graph:
        continue
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        circles.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return circles


def test_imports_run_down_only():
  _, graph = _graph()
  bad = _against_layering(graph)
  assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_import_circle():
  _, graph = _graph()
  circles = _circles(graph)
  assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize("graph,reason", [
    ({"gp_jax.errors": {"gp_jax.runs.system"}}, "layer 0 importing layer 6"),
    ({"gp_jax.util.aio": {"gp_jax.llm.base"}}, "layer 0 importing layer 1"),
    ({"gp_jax.rl.ppo": {"gp_jax.baselines.router"}}, "layer 4 importing layer 5"),
    ({"gp_jax.sim.simulator": {"gp_jax.graph.garnet"}}, "layer 3 importing layer 3"),
    ({"gp_jax.graph.features": {"gp_jax.llm.base"}}, "graph/ never imports llm/"),
    ({"gp_jax.runs.train": {"experiments.common"}}, "never imports the runners"),
    ({"gp_jax.serving.engine.session": {"gp_jax.runs.studies.drift"}},
     "serving/ never imports a study"),
    ({"gp_jax.runs.system": {"gp_jax.serving.state.store"}}, "layer 6 importing layer 7"),
])
def test_checker_rejects_a_bad_graph(graph, reason):
  """Each made-up import against the rules is reported, layer 0 included."""
  bad = _against_layering(graph)
  assert len(bad) == 1 and reason in bad[0], bad


def test_checker_accepts_what_the_rules_allow():
  graph = {"gp_jax.errors": {"gp_jax.util.aio"}, "gp_jax.util.aio": {"gp_jax.files"},
           "gp_jax.runs.train": {"gp_jax.rl.ppo", "gp_jax.errors"},
           "gp_jax.rl.ppo": {"gp_jax.rl.batch", "gp_jax.graph.garnet"},
           "gp_jax.serving.engine.session": {"gp_jax.runs.system", "gp_jax.serving.state.store"}}
  assert _against_layering(graph) == []


def test_checker_finds_a_circle():
  graph = {"gp_jax.rl.a": {"gp_jax.rl.b"}, "gp_jax.rl.b": {"gp_jax.rl.c"},
           "gp_jax.rl.c": {"gp_jax.rl.a"}, "gp_jax.rl.d": {"gp_jax.rl.a"}}
  assert _circles(graph) == [["gp_jax.rl.a", "gp_jax.rl.b", "gp_jax.rl.c"]]
  assert _circles({"gp_jax.rl.a": {"gp_jax.rl.b"}, "gp_jax.rl.b": set()}) == []


@pytest.mark.parametrize("source,expected", [
    ("from gp_jax.rl import ppo\n", "gp_jax.rl.ppo"),
    ("from . import ppo\n", "gp_jax.rl.ppo"),
    ("def f():\n  from gp_jax.runs import system\n", "gp_jax.runs.system"),
    ("import experiments.common\n", "experiments.common"),
])
def test_imports_are_seen(tmp_path, source, expected):
  """The checker sees module-level, relative and function-local imports."""
  path = tmp_path / "m.py"
  path.write_text(source)
  known = {"gp_jax.rl.ppo", "gp_jax.runs.system"}
  assert expected in _imports("gp_jax.rl.m", path, known)


def test_run_layer_functions_are_short():
  """The run layer reads as a list of named steps: no function (or method) over 60 lines."""
  long = []
  for path in sorted((ROOT / "gp_jax" / "runs").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > 60:
          long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
  assert not long, "run-layer functions over 60 lines:\n" + "\n".join(long)


SERVING_MAX_LINES = 450


def test_serving_modules_are_short():
  """The served router is cut along its concepts: no module of gp_jax/serving over 450 lines."""
  long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "gp_jax" / "serving").rglob("*.py"))
          if (n := len(p.read_text().splitlines())) > SERVING_MAX_LINES}
  assert not long, f"serving modules over {SERVING_MAX_LINES} lines: {long}"
