#!/usr/bin/env bash
# Makes sure PostgreSQL (127.0.0.1:5432) and Redis (127.0.0.1:6379) answer, for `make dev`
# and `make test` on a fresh machine: installs them from Debian packages when absent and
# starts them when stopped. Idempotent; does nothing when both already answer.
set -euo pipefail

pg_up() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
redis_up() { printf 'PING\r\n' | timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/6379; cat >&3; head -c 5 <&3' 2>/dev/null | grep -q PONG; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

wait_for() { # name check
  for _ in $(seq 1 50); do "$2" && return 0; sleep 0.2; done
  echo "services: $1 did not come up" >&2; return 1
}

if ! pg_up; then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    echo "services: installing PostgreSQL from Debian packages"
    apt_install postgresql
    fresh_pg=1
  fi
  version=$(ls /etc/postgresql | sort -V | tail -n1)
  echo "services: starting PostgreSQL $version"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  wait_for PostgreSQL pg_up
  if [ "${fresh_pg:-0}" = 1 ]; then
    # The embedded default DATABASE_URL logs in as postgres/postgres over TCP.
    as_root su postgres -c "psql -q -c \"ALTER USER postgres PASSWORD 'postgres'\""
  fi
fi

if ! redis_up; then
  if ! command -v redis-server >/dev/null; then
    echo "services: installing Redis from Debian packages"
    apt_install redis-server
  fi
  echo "services: starting Redis"
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for Redis redis_up
fi
echo "services: PostgreSQL and Redis are up"
