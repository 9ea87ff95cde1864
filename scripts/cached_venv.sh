# Sourced by the setup scripts that build a separate venv of their own under the cache folder
# (scripts/setup_llmrouter.sh, setup_torch_ref.sh, setup_litellm.sh); not run by itself.
#
#   cached_venv TAG VENV CHECK PIP_ARGS...
#
# Creates VENV once with `pip install PIP_ARGS...`, then runs CHECK (python code) with the venv's
# python, and prints the venv's python path on stdout. Like env.sh it holds a lock,
# $CACHE/.TAG.lock (one creator at a time; others wait, then reuse), and marks a finished venv
# with .complete, so an interrupted install is redone rather than trusted. pip's output goes to
# $CACHE/TAG-install.log; the progress lines ([TAG] ...) go to stderr. Needs CACHE set.
cached_venv() {
  local tag="$1" venv="$2" check="$3" log lock
  shift 3
  log="$CACHE/$tag-install.log"
  mkdir -p "$CACHE"
  exec {lock}>"$CACHE/.$tag.lock"
  flock "$lock"
  if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
    echo "[$tag] creating $venv ($*; a few minutes the first time; log: $log)" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    if ! "$venv/bin/pip" install "$@" >"$log" 2>&1; then
      grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
      echo "[$tag] pip install failed (log: $log)" >&2
      return 1
    fi
    if ! "$venv/bin/python" -c "$check" >>"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "[$tag] the check failed: $check (log: $log)" >&2
      return 1
    fi
    touch "$venv/.complete"
    echo "[$tag] ready" >&2
  fi
  flock -u "$lock"
  exec {lock}>&-
  echo "$venv/bin/python"
}
