"""Graph Counselor's rooms, checked from the source's imports (every import statement, including
function-local ones): a room imports only the rooms below it, never one above.

  kg < agents < eval < synth < routing
"""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gp_jax" / "counselor"
ROOMS = ("kg", "agents", "eval", "synth", "routing")


def _counselor_imports(path: pathlib.Path) -> set[str]:
  """Rooms of gp_jax.counselor that the module at `path` imports."""
  rooms = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = [node.module or ""]
      if node.level:   # relative: resolved against the module's package
        pkg = ["gp_jax", "counselor", *path.relative_to(PACKAGE).parts[:-1]]
        base = pkg[:len(pkg) - (node.level - 1)] + ([node.module] if node.module else [])
      names = [".".join(base + [a.name]) for a in node.names]
    else:
      continue
    for name in names:
      parts = name.split(".")
      if parts[:2] == ["gp_jax", "counselor"] and len(parts) > 2:
        rooms.add(parts[2])
  return rooms


def test_every_module_is_in_a_room():
  loose = [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
  assert not loose, f"modules outside the rooms {ROOMS}: {loose}"
  assert sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__") == \
      sorted(ROOMS)


def test_rooms_import_only_the_rooms_below():
  bad = []
  for room in ROOMS:
    allowed = set(ROOMS[:ROOMS.index(room) + 1])
    for path in sorted((PACKAGE / room).rglob("*.py")):
      for other in sorted(_counselor_imports(path) - allowed):
        bad.append(f"{path.relative_to(ROOT)} imports counselor/{other}/ (a room above {room}/)")
  assert not bad, "\n".join(bad)


def test_the_check_sees_imports(tmp_path):
  # The check is not vacuous: it finds the imports the rooms do have.
  assert _counselor_imports(PACKAGE / "synth" / "oracle.py") >= {"kg", "agents", "eval"}
  assert _counselor_imports(PACKAGE / "routing" / "router.py") >= {"kg", "agents"}
  f = tmp_path / "m.py"
  f.write_text("def f():\n  from gp_jax.counselor.routing import router\n")
  assert _counselor_imports(f) == {"routing"}
