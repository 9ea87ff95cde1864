#!/usr/bin/env bash
# A throwaway local PostgreSQL for the replica store (gp_jax/serving/state/postgres.py) and its
# test stage (scripts/pg_tests.sh):
#   bash scripts/postgres.sh install          installs PostgreSQL (Debian: apt-get) when missing
#   bash scripts/postgres.sh start DIR PORT   a new cluster in DIR (installs first if needed),
#                                             listening on 127.0.0.1:PORT only; prints its URL
#                                             postgresql://gp_jax:<password>@127.0.0.1:PORT/gp_jax
#   bash scripts/postgres.sh url DIR          prints the URL of the cluster in DIR again
#   bash scripts/postgres.sh stop DIR         stops it (files stay; delete DIR to throw it away)
# The cluster has one password user and one database, both named gp_jax; the password is random
# and kept in DIR/password (mode 600). No Unix socket, no system service: nothing outside DIR.
# PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user (made by
# the Debian package), which must be able to reach DIR: a folder under /tmp works, a folder
# under a mode-700 home or pytest's tmp_path does not. As another user it runs as that user.
# The binaries are found on PATH (initdb), else in /usr/lib/postgresql/<version>/bin (where the
# Debian package puts them, off PATH), else installed.
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }

pg_bin() {
  local d
  if d="$(command -v initdb 2>/dev/null)"; then
    dirname "$(readlink -f "$d")"; return 0
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  return 1
}

install_pg() {
  if pg_bin >/dev/null; then return 0; fi
  command -v apt-get >/dev/null || die "PostgreSQL is not installed and this is not a Debian/Ubuntu machine: install PostgreSQL >= 12 (initdb, pg_ctl) and rerun"
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "installing PostgreSQL needs root (apt-get); rerun as root"
    sudo="sudo"
  fi
  # The package would create and start a system cluster on port 5432; none is wanted here.
  if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    $sudo mkdir -p /etc/postgresql-common
    echo "create_main_cluster = false" | $sudo tee /etc/postgresql-common/createcluster.conf >/dev/null
  fi
  echo "[postgres] installing PostgreSQL (apt-get install postgresql)" >&2
  $sudo apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends postgresql >&2
  pg_bin >/dev/null || die "apt-get installed postgresql but no initdb was found under /usr/lib/postgresql"
}

# Runs a command as the cluster's owner: `postgres` when we are root, else ourselves.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root needs the 'postgres' user (the Debian package makes it)"
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

url_of() {
  local dir="$1" port
  [ -f "$dir/port" ] && [ -f "$dir/password" ] || die "$dir holds no cluster made by this script"
  port="$(cat "$dir/port")"
  echo "postgresql://gp_jax:$(cat "$dir/password")@127.0.0.1:$port/gp_jax"
}

start() {
  local dir="$1" port="$2" bin owner
  [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "PORT must be a number in 1..65535, got '$port'"
  install_pg
  bin="$(pg_bin)"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  if [ -f "$dir/data/postmaster.pid" ] && as_owner "$bin/pg_ctl" status -D "$dir/data" >/dev/null 2>&1; then
    [ "$(cat "$dir/port")" = "$port" ] || die "a cluster already runs in $dir on port $(cat "$dir/port")"
    url_of "$dir"; return 0
  fi
  if [ "$(id -u)" = 0 ]; then
    owner=postgres
    chown postgres: "$dir"
    chmod 700 "$dir"
    as_owner test -w "$dir" || die "the postgres user cannot reach $dir (a parent folder is closed to it); use a folder under /tmp"
  fi
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    rm -rf "$dir/data"
    ( umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=\n' >"$dir/password" )
    [ -n "${owner:-}" ] && chown postgres: "$dir/password"
    as_owner "$bin/initdb" -D "$dir/data" -U gp_jax --pwfile="$dir/password" \
      --auth-host=scram-sha-256 --auth-local=reject -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; die "initdb failed in $dir/data (log above)"; }
  fi
  echo "$port" >"$dir/port"
  as_owner "$bin/pg_ctl" start -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories= -c shared_buffers=32MB -c max_connections=100 -c fsync=on -c synchronous_commit=on" \
    >/dev/null || { tail -n 20 "$dir/server.log" >&2 || true; die "PostgreSQL did not start in $dir on port $port (log above)"; }
  PGPASSWORD="$(cat "$dir/password")" PGCONNECT_TIMEOUT=10 "$bin/psql" -q -X -h 127.0.0.1 -p "$port" \
    -U gp_jax -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'gp_jax'" | grep -q 1 \
    || PGPASSWORD="$(cat "$dir/password")" "$bin/createdb" -h 127.0.0.1 -p "$port" -U gp_jax gp_jax \
    || die "could not create the gp_jax database (server log: $dir/server.log)"
  url_of "$dir"
}

stop() {
  local dir="$1" bin
  [ -d "$dir/data" ] || die "$dir holds no cluster"
  bin="$(pg_bin)" || die "PostgreSQL is not installed"
  if as_owner "$bin/pg_ctl" status -D "$dir/data" >/dev/null 2>&1; then
    as_owner "$bin/pg_ctl" stop -D "$dir/data" -m fast -w -t 60 >/dev/null
  fi
}

case "${1:-}" in
  install) install_pg; echo "[postgres] $(pg_bin)" >&2 ;;
  start) [ $# -eq 3 ] || die "usage: $0 start DIR PORT"; start "$2" "$3" ;;
  url) [ $# -eq 2 ] || die "usage: $0 url DIR"; url_of "$2" ;;
  stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
  *) die "usage: $0 install | start DIR PORT | url DIR | stop DIR" ;;
esac
