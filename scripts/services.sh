#!/usr/bin/env bash
# The real Redis and PostgreSQL+pgvector the shared cache tiers are tested against, on free loopback ports in a
# temp dir. `start` installs what is missing, starts both and prints the `export ...` lines to eval;
# `stop` stops what the matching `start` started (it reads VELO_SERVICES_DIR from that output).
#   eval "$(scripts/services.sh start)"; ...; scripts/services.sh stop
# PostgreSQL comes from Debian (postgresql + postgresql-15-pgvector) where apt has pgvector; where it has not
# (Debian 12), from the PostgreSQL 16 + pgvector build that the `pgserver` wheel on PyPI ships.
set -euo pipefail
PGSERVER_WHEEL="pgserver==0.1.4"
PGSERVER_DIR="${VELO_PGSERVER_DIR:-/var/tmp/velo-pgserver}"

log() { echo "services: $*" >&2; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

apt_install() {
  [ "$(id -u)" = 0 ] || { log "need root to apt-get install $*"; return 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2 || {
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2; }
}

# Prints the bin dir of a PostgreSQL that has the pgvector extension.
pg_bindir() {
  local debian=/usr/lib/postgresql/15/bin
  [ -x "$debian/postgres" ] || apt_install postgresql >/dev/null || true
  if [ ! -f /usr/share/postgresql/15/extension/vector.control ] && apt-cache show postgresql-15-pgvector >/dev/null 2>&1; then
    apt_install postgresql-15-pgvector >/dev/null || true
  fi
  if [ -x "$debian/postgres" ] && [ -f /usr/share/postgresql/15/extension/vector.control ]; then
    echo "$debian"; return
  fi
  if [ ! -x "$PGSERVER_DIR/pgserver/pginstall/bin/postgres" ]; then
    log "no pgvector package in apt; using the PostgreSQL+pgvector build shipped in the $PGSERVER_WHEEL wheel"
    local tmp; tmp="$(mktemp -d)"
    python3 -m pip download -q --disable-pip-version-check --no-deps "$PGSERVER_WHEEL" -d "$tmp" >&2
    mkdir -p "$PGSERVER_DIR"
    python3 -m zipfile -e "$tmp"/pgserver-*.whl "$PGSERVER_DIR" >&2
    chmod -R a+rX "$PGSERVER_DIR" && chmod a+x "$PGSERVER_DIR"/pgserver/pginstall/bin/*
    rm -rf "$tmp"
  fi
  echo "$PGSERVER_DIR/pgserver/pginstall/bin"
}

# PostgreSQL refuses to run as root: run it as the `postgres` user then (created if missing).
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

start_redis() {
  command -v redis-server >/dev/null || apt_install redis-server
  local port; port="$(free_port)"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$DIR" --save "" --appendonly no \
    --daemonize yes --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" >&2
  for _ in $(seq 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && { echo "redis://127.0.0.1:$port/0"; return; }
    sleep 0.1
  done
  log "redis-server did not answer; see $DIR/redis.log"; return 1
}

start_postgres() {
  local bin port; bin="$(pg_bindir)"; port="$(free_port)"
  mkdir -p "$DIR/pg" && chmod a+rx "$DIR"
  if [ "$(id -u)" = 0 ]; then as_pg true && chown postgres "$DIR/pg"; fi
  as_pg "$bin/initdb" -D "$DIR/pg/data" -U velo --auth=trust -E UTF8 >"$DIR/pg.log" 2>&1
  as_pg "$bin/pg_ctl" -D "$DIR/pg/data" -l "$DIR/pg/server.log" -w \
    -o "-k $DIR/pg -h 127.0.0.1 -p $port" start >>"$DIR/pg.log" 2>&1 || {
    log "postgres did not start; see $DIR/pg.log and $DIR/pg/server.log"; return 1; }
  echo "$bin" >"$DIR/pg.bin"
  echo "postgresql://velo@127.0.0.1:$port/postgres"
}

start() {
  DIR="$(mktemp -d "${TMPDIR:-/tmp}/velo-services.XXXXXX")"
  local redis_url pg_dsn
  redis_url="$(start_redis)"
  pg_dsn="$(start_postgres)"
  echo "export VELO_SERVICES_DIR=$DIR VELO_TEST_REDIS_URL=$redis_url VELO_TEST_PG_DSN=$pg_dsn"
}

stop() {
  DIR="${VELO_SERVICES_DIR:?run stop in the shell that evaluated start}"
  [ -f "$DIR/redis.pid" ] && kill "$(cat "$DIR/redis.pid")" 2>/dev/null || true
  [ -f "$DIR/pg.bin" ] && as_pg "$(cat "$DIR/pg.bin")/pg_ctl" -D "$DIR/pg/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
