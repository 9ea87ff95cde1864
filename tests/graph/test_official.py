"""The released GraphPlanner network and update in gp_jax against the released PyTorch code's own
numbers (official_*.npz, written by make_official_reference.py; docs/parity.md)."""
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax import errors
from gp_jax.graph import official
from gp_jax.rl import official_reference

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
FILES = sorted(HERE.glob("official_*.npz"))


def test_fixtures_cover_the_cases_the_issue_names():
  """At least two files; one with >= 1,000 history rows, two task classes, masked actions and an
  empty workflow table; one with an empty history."""
  assert len(FILES) >= 2
  refs = [official_reference.load(f) for f in FILES]
  assert any(r["in/his_rows"].shape[0] >= 1000 and len(set(r["in/his_index"][:, 1])) >= 2
             and (r["in/mask"] == 0).any() and (r["in/local_count"] == 0).any() for r in refs)
  assert any(r["in/his_rows"].shape[0] == 0 for r in refs)
  assert all(r.has_update for r in refs)


CASES = ([(f, True) for f in FILES]
         + [(HERE / f"official_{n}.npz", False) for n in ("small", "large")])   # eager: ~30 s each


@pytest.mark.parametrize("path,jit", CASES,
                         ids=[f"{f.stem}-{'jit' if j else 'eager'}" for f, j in CASES])
def test_parity_with_the_released_code(path, jit):
  ref = official_reference.load(path)
  rows = official_reference.compare(ref, official_reference.compute(ref, jit=jit))
  names = {r.name for r in rows}
  assert {"probs", "value", "policy_loss", "value_loss", "entropy", "policy_loss_steps",
          "value_loss_steps", "policy grads", "value grads", "policy step", "value step"} <= names
  bad = [(r.name, r.max_abs, r.max_rel) for r in rows if not r.ok]
  assert not bad, bad


def test_a_wrong_number_fails_the_check():
  ref = official_reference.load(HERE / "official_small.npz")
  ours = official_reference.compute(ref)
  ours["probs"] = ours["probs"] + 2 * official_reference.PROB_ATOL
  ours["value_loss"] *= 1 + 2 * official_reference.REL_TOL
  rows = {r.name: r for r in official_reference.compare(ref, ours)}
  assert not rows["probs"].ok and not rows["value_loss"].ok and rows["value"].ok


def test_state_dict_round_trip():
  ref = official_reference.load(HERE / "official_large.npz")
  nets = official.networks(ref.hidden, ref.num_classes)
  params = official_reference.params_of(ref, nets)
  for net in ("policy", "value"):
    sd = ref.state_dict(net)
    back = official.to_state_dict(params[net])
    assert set(back) == set(sd)
    for k in sd:
      np.testing.assert_array_equal(back[k], sd[k])
    again = official.from_state_dict(back, params[net])
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, params[net])


def test_state_dict_errors_name_the_entry():
  ref = official_reference.load(HERE / "official_small.npz")
  nets = official.networks(ref.hidden, ref.num_classes)
  params = official_reference.params_of(ref, nets)
  sd = official.to_state_dict(params["policy"])
  missing = dict(sd)
  del missing["state_transform.0.weight"]
  with pytest.raises(errors.DataError, match="state_transform.0.weight"):
    official.from_state_dict(missing, params["policy"])
  wrong = dict(sd, **{"class_embedding.weight": np.zeros((3, 3), np.float32)})
  with pytest.raises(errors.DataError, match="class_embedding.weight"):
    official.from_state_dict(wrong, params["policy"])
  with pytest.raises(errors.DataError, match="does not have"):
    official.from_state_dict(dict(sd, extra=np.zeros(1)), params["policy"])


def test_padding_changes_nothing_and_one_bucket_traces_once():
  """More padded history and workflow rows give the same numbers; a history of another size in
  the same bucket reuses the compiled forward."""
  ref = official_reference.load(HERE / "official_large.npz")
  nets = official.networks(ref.hidden, ref.num_classes)
  params = official_reference.params_of(ref, nets)
  query, llm, hist, obs = official_reference.inputs(ref)
  traces = []

  def fwd(params, query, llm, hist, obs):
    traces.append(1)
    return official.forward(nets, params, query, llm, hist, obs)
  fwd = jax.jit(fwd)
  p1, v1 = fwd(params, query, llm, hist, obs)

  def pad(m, n, axis):
    widths = lambda x: [(0, 0)] * axis + [(0, n)] + [(0, 0)] * (x.ndim - axis - 1)
    return official.Memory(*(jnp.pad(x, widths(x)) for x in m))
  obs2 = obs._replace(local=pad(obs.local, 5, 1))
  wider = jax.jit(lambda *a: official.forward(nets, *a))
  p2, v2 = wider(params, query, llm, pad(hist, 700, 0), obs2)
  np.testing.assert_allclose(p2, p1, atol=1e-6)
  np.testing.assert_allclose(v2, v1, rtol=1e-5, atol=1e-6)
  fewer = hist._replace(valid=hist.valid & (jnp.arange(hist.valid.shape[0]) < 900))
  fwd(params, query, llm, fewer, obs)
  assert len(traces) == 1


def _write(tmp_path, name, arrays):
  path = tmp_path / name
  np.savez(path, **arrays)
  return path


@pytest.mark.parametrize("change,match", [
    (lambda a: a.pop("in/mask"), "'in/mask'"),
    (lambda a: a.update({"in/state": a["in/state"][:, :3]}), "'in/state' has shape"),
    (lambda a: a.update({"in/his_query": a["in/his_query"] + 10_000}), "ids outside"),
    (lambda a: a.update({"upd/perm": np.zeros_like(a["upd/perm"])}), "permutations"),
    (lambda a: [a.pop(k) for k in list(a) if k.startswith("sd/value/")], "sd/value"),
])
def test_malformed_files_are_one_data_error(tmp_path, change, match):
  with np.load(HERE / "official_small.npz") as z:
    arrays = {k: z[k] for k in z.files}
  change(arrays)
  with pytest.raises(errors.DataError, match=match):
    official_reference.load(_write(tmp_path, "bad.npz", arrays))
  (tmp_path / "junk.npz").write_bytes(b"not a zip")
  with pytest.raises(errors.DataError, match="cannot be read"):
    official_reference.load(tmp_path / "junk.npz")


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "experiments.parity", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=600)


def test_cli_exit_codes(tmp_path):
  ok = _cli(f"--reference={HERE / 'official_small.npz'}")
  assert ok.returncode == 0, ok.stderr
  assert "within tolerance" in ok.stdout and "probs" in ok.stdout and "policy step" in ok.stdout
  with np.load(HERE / "official_small.npz") as z:
    arrays = {k: z[k] for k in z.files}
  arrays["out/value"] = arrays["out/value"] + 0.5
  off = _cli(f"--reference={_write(tmp_path, 'off.npz', arrays)}")
  assert off.returncode == 1, off.stderr
  assert "outside tolerance: value" in off.stdout
  del arrays["in/llm_emb"]
  bad = _cli(f"--reference={_write(tmp_path, 'bad.npz', arrays)}")
  assert bad.returncode == 2
  lines = bad.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error:") and "in/llm_emb" in lines[0]
  missing = _cli("--reference=/nonexistent/official.npz")
  assert missing.returncode == 2 and missing.stderr.strip().startswith("error:")
