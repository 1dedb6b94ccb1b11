#!/usr/bin/env bash
# Download benchmark of the context gateway, on loopback.
#
#  1. Throughput of one cached 64 MiB bundle with 1, 8 and 32 concurrent
#     clients (wrk), side by side with nginx serving the same file from disk.
#  2. Peak memory of the service (RSS, its cached bundles' pages included)
#     during 32 concurrent downloads of 8 distinct 256 MiB bundles; must
#     stay under the cache budget + 128 MiB.
#
# Usage: benches/download.sh            (DURATION=5 seconds per run, REPS=3
#        runs per case, each server in turn;
#        BIN_DIR=dir to use already built binaries; TMPDIR for the 4 GiB)
# Installs wrk and nginx with apt-get when missing. Everything runs as this
# user on 127.0.0.1 and is removed at the end.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

DURATION="${DURATION:-5}"
REPS="${REPS:-3}"
CACHE_MIB="${CACHE_MIB:-512}"
CS_PORT="${CS_PORT:-18480}"
NGINX_PORT="${NGINX_PORT:-18481}"

need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"

# BIN_DIR=dir: use the context-service and contextctl already built there.
if [ -n "${BIN_DIR:-}" ]; then
  TARGET="$BIN_DIR"
else
  echo "building release binaries..." >&2
  cargo build --release --quiet --bin context-service --bin contextctl
  TARGET="${CARGO_TARGET_DIR:-target}/release"
fi
SERVICE="$TARGET/context-service"
CTL="$TARGET/contextctl"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/cs-bench.XXXXXX")"
# 8 x 256 MiB bundles, their sources and transient packs need ~4 GiB.
free_kb=$(df -Pk "$WORK" | awk 'NR == 2 {print $4}')
if [ "$free_kb" -lt $((4 * 1024 * 1024)) ]; then
  echo "need 4 GiB free under $WORK, have $((free_kb / 1024)) MiB" >&2
  rmdir "$WORK"
  exit 1
fi
CS_PID=""
NGINX_PID=""
cleanup() {
  [ -n "$CS_PID" ] && kill "$CS_PID" 2>/dev/null || true
  [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

export CS_DATA_DIR="$WORK/data"
URL="http://127.0.0.1:$CS_PORT"

start_service() {
  CS_LISTEN_ADDR="127.0.0.1:$CS_PORT" CS_CACHE_BYTES=$((CACHE_MIB * 1024 * 1024)) \
    CS_BUNDLE_MAX_BYTES=$((300 * 1024 * 1024)) CS_BUNDLE_MAX_FILE_BYTES=$((300 * 1024 * 1024)) \
    RUST_LOG=warn "$SERVICE" serve >"$WORK/service.log" 2>&1 &
  CS_PID=$!
  for _ in $(seq 1 100); do
    # Our process must be the one answering (the port may be taken).
    kill -0 "$CS_PID" 2>/dev/null || break
    curl -fsS "$URL/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "service did not start:" >&2
  cat "$WORK/service.log" >&2
  exit 1
}

stop_service() {
  kill "$CS_PID"
  wait "$CS_PID" 2>/dev/null || true
  CS_PID=""
}

ctl() { "$CTL" --url "$URL" --data-dir "$CS_DATA_DIR" "$@"; }

# Uploads directory $2 as workload $1, activates it, prints the revision.
publish() {
  ctl workload create "$1" >/dev/null
  local rev
  rev="$(ctl workload upload "$1" "$2")" || {
    echo "uploading $1 failed; service log:" >&2
    tail -5 "$WORK/service.log" >&2
    exit 1
  }
  ctl workload activate "$1" "$rev" >/dev/null
  echo "$rev"
}

# wrk's "Transfer/sec" in MB/s (wrk prints binary units).
transfer_mbs() {
  awk '/Transfer\/sec/ {
    v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[A-Za-z]+/, "", v);
    f = (u == "GB") ? 1024 : (u == "MB") ? 1 : (u == "KB") ? 1/1024 : 1/1048576;
    printf "%.0f", v * f * 1.048576 }'
}

start_service
TOKEN="$(ctl token)"

echo "preparing a 64 MiB bundle..." >&2
mkdir -p "$WORK/src64"
head -c $((64 * 1024 * 1024)) /dev/urandom >"$WORK/src64/data.bin"
REV64="$(publish bench64 "$WORK/src64")"
BUNDLE64="$WORK/bundle64.tar.gz"
ctl workload download bench64 -f "$BUNDLE64" >/dev/null
DL_PATH="/v1/workloads/bench64/revisions/$REV64/bundle"
SIZE64=$(stat -c %s "$BUNDLE64")

mkdir -p "$WORK/www" "$WORK/nginx"
cp "$BUNDLE64" "$WORK/www/bundle.tar.gz"
# nginx workers run as an unprivileged user: let them read the file.
chmod 755 "$WORK" "$WORK/www"
chmod 644 "$WORK/www/bundle.tar.gz"
cat >"$WORK/nginx/nginx.conf" <<CONF
worker_processes auto;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  server {
    listen 127.0.0.1:$NGINX_PORT;
    root $WORK/www;
  }
}
CONF
"$NGINX" -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" &
NGINX_PID=$!
for _ in $(seq 1 50); do
  curl -fs -o /dev/null "http://127.0.0.1:$NGINX_PORT/bundle.tar.gz" && break
  sleep 0.1
done

# Warm the cache (and the page cache for nginx).
curl -fsS -o /dev/null -H "Authorization: Bearer $TOKEN" "$URL$DL_PATH"
curl -fsS -o /dev/null "http://127.0.0.1:$NGINX_PORT/bundle.tar.gz"

echo
load1() { cut -d' ' -f1 /proc/loadavg; }
echo "== download throughput: cached $((SIZE64 / 1048576)) MiB bundle, ${DURATION}s per run, $REPS runs each alternating, loopback, $(nproc) cores (wrk, same file, same run) =="
echo "(each figure is the median of the runs; the ratio is the median of the runs' ratios)"
printf "%-8s %18s %14s %8s %8s %6s  %s\n" clients context-service nginx ratio target load "ratios of the runs"
# One wrk run against $1 with $2 clients; prints MB/s (fails on a non-2xx).
wrk_mbs() {
  local url="$1" c="$2" t
  t=$(( c < 2 ? 1 : 2 ))
  shift 2
  wrk -t"$t" -c"$c" -d"${DURATION}s" "$@" "$url" >"$WORK/wrk.txt"
  if grep -q "Non-2xx" "$WORK/wrk.txt"; then
    echo "downloads failed:" >&2
    cat "$WORK/wrk.txt" >&2
    exit 1
  fi
  transfer_mbs <"$WORK/wrk.txt"
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for c in 1 8 32; do
  css=() ngs=() ratios=()
  for _ in $(seq 1 "$REPS"); do
    # Alternating, so a change in the machine's load hits both servers.
    cs=$(wrk_mbs "$URL$DL_PATH" "$c" -H "Authorization: Bearer $TOKEN")
    ng=$(wrk_mbs "http://127.0.0.1:$NGINX_PORT/bundle.tar.gz" "$c")
    css+=("$cs") ngs+=("$ng")
    ratios+=("$(awk -v a="$cs" -v b="$ng" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print 0 }')")
  done
  cs=$(printf '%s\n' "${css[@]}" | median)
  ng=$(printf '%s\n' "${ngs[@]}" | median)
  ratio=$(printf '%s\n' "${ratios[@]}" | median)
  ratio=$(awk -v r="$ratio" 'BEGIN { printf "%.2f", r }')
  mark=$(awk -v r="$ratio" 'BEGIN { print (r + 0 >= 1.0) ? "ok" : "MISS" }')
  printf "%-8s %13s MB/s %9s MB/s %8s %8s %6s  %s %s\n" "$c" "$cs" "$ng" "$ratio" ">= 1.0" "$(load1)" "${ratios[*]}" "$mark"
done
kill "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true; NGINX_PID=""

echo
echo "preparing 8 distinct 256 MiB bundles..." >&2
mkdir -p "$WORK/base"
head -c $((128 * 1024 * 1024)) /dev/urandom >"$WORK/base/a.bin"
head -c $((128 * 1024 * 1024)) /dev/urandom >"$WORK/base/b.bin"
LUA="$WORK/rotate.lua"
echo 'paths = {}' >"$LUA"
for i in $(seq 1 8); do
  d="$WORK/src256-$i"
  mkdir -p "$d"
  ln "$WORK/base/a.bin" "$d/a.bin" 2>/dev/null || cp "$WORK/base/a.bin" "$d/a.bin"
  ln "$WORK/base/b.bin" "$d/b.bin" 2>/dev/null || cp "$WORK/base/b.bin" "$d/b.bin"
  echo "bundle $i" >"$d/id.txt"
  rev="$(publish "big-$i" "$d")"
  echo "paths[$i] = \"/v1/workloads/big-$i/revisions/$rev/bundle\"" >>"$LUA"
done
cat >>"$LUA" <<'LUA'
n = 0
request = function()
  n = n + 1
  return wrk.format("GET", paths[(n % 8) + 1])
end
LUA
SIZE256=$(stat -c %s "$(find "$CS_DATA_DIR/blobs/sha256" -type f -size +200M | head -1)")

# Fresh process: VmHWM (peak RSS) then covers the download phase only.
stop_service
start_service
TOKEN="$(ctl token)"
RSS_IDLE=$(awk '/VmRSS/ {print $2}' "/proc/$CS_PID/status")
# Cached bundles are their blob files mapped with their pages read in, so
# their pages are in RSS (RssFile) whether a download touched them or not:
# the kernel's own peak, VmHWM, is the peak memory held.
wrk -t2 -c32 -d"$((DURATION * 2))s" --timeout 60s -H "Authorization: Bearer $TOKEN" -s "$LUA" "$URL" >"$WORK/wrk-256.txt"
HWM_KB=$(awk '/VmHWM/ {print $2}' "/proc/$CS_PID/status")
if grep -q "Non-2xx" "$WORK/wrk-256.txt"; then
  echo "downloads failed:" >&2
  cat "$WORK/wrk-256.txt" >&2
  exit 1
fi
MBS=$(transfer_mbs <"$WORK/wrk-256.txt")
REQS=$(awk '/requests in/ {print $1}' "$WORK/wrk-256.txt")
LIMIT_KB=$(( (CACHE_MIB + 128) * 1024 ))
echo "== memory: 32 concurrent downloads of 8 distinct $((SIZE256 / 1048576)) MiB bundles, $((DURATION * 2))s =="
echo "completed requests: $REQS, throughput: $MBS MB/s"
echo "idle RSS: $((RSS_IDLE / 1024)) MiB; peak RSS (VmHWM, the cache's pages included): $((HWM_KB / 1024)) MiB; limit (cache budget $CACHE_MIB MiB + 128 MiB): $((LIMIT_KB / 1024)) MiB; load $(load1)"
if [ "$HWM_KB" -lt "$LIMIT_KB" ]; then
  echo "memory: PASS"
else
  echo "memory: FAIL"
  exit 1
fi
