#!/usr/bin/env bash
# A throwaway PostgreSQL on loopback for scripts (benchmarks); the Rust
# tests start their own (tests/common/postgres.rs). The server binaries are
# Debian's (`apt-get install postgresql`, as .ci/run does); as root the
# server runs as the `postgres` user, since it refuses to run as root.
#
#   tests/scale/postgres.sh up      initdb + start on a free port (idempotent)
#   tests/scale/postgres.sh url     postgres://cs@127.0.0.1:<port>/cs
#   tests/scale/postgres.sh restart a fast restart on the same port (every
#                                   connection dropped; the soak's fault)
#   tests/scale/postgres.sh down    stop it and remove its state dir
#
# State dir: CONTEXT_SERVICE_POSTGRES_STATE (default /tmp/cs-postgres-$UID).
set -euo pipefail

STATE="${CONTEXT_SERVICE_POSTGRES_STATE:-/tmp/cs-postgres-$(id -u)}"

bin_dir() {
  if command -v pg_ctl >/dev/null; then
    dirname "$(command -v pg_ctl)"
    return
  fi
  local newest
  newest=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$newest" ] || { echo "postgres.sh: no PostgreSQL server binaries (apt-get install postgresql)" >&2; exit 1; }
  echo "$newest"
}

as_server() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case "${1:-}" in
  up)
    if [ -f "$STATE/port" ] && as_server "$(bin_dir)/pg_ctl" -D "$STATE/data" status >/dev/null 2>&1; then
      exit 0
    fi
    mkdir -p "$STATE"
    [ "$(id -u)" = 0 ] && chown postgres "$STATE"
    bin=$(bin_dir)
    [ -d "$STATE/data" ] || as_server "$bin/initdb" -D "$STATE/data" -A trust -U cs -E UTF8 --locale=C >/dev/null
    port=$(free_port)
    # Durable like a production server (fsync on): benchmarks compare it
    # with the embedded store, which syncs its commits too.
    as_server "$bin/pg_ctl" -D "$STATE/data" -l "$STATE/log" -w -t 60 \
      -o "-p $port -k $STATE -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
    echo "$port" >"$STATE/port"
    psql -X -q -h 127.0.0.1 -p "$port" -U cs -d postgres -c "CREATE DATABASE cs" >/dev/null
    ;;
  url)
    echo "postgres://cs@127.0.0.1:$(cat "$STATE/port")/cs"
    ;;
  restart)
    [ -f "$STATE/port" ] || { echo "postgres.sh: not up (run '$0 up')" >&2; exit 1; }
    # pg_ctl restart reuses the running server's options (port, socket dir).
    as_server "$(bin_dir)/pg_ctl" -D "$STATE/data" -l "$STATE/log" -m fast -w -t 60 restart >/dev/null
    ;;
  down)
    if [ -d "$STATE/data" ]; then
      as_server "$(bin_dir)/pg_ctl" -D "$STATE/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$STATE"
    ;;
  *)
    echo "usage: $0 up|url|restart|down" >&2
    exit 2
    ;;
esac
