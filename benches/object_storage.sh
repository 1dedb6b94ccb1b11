#!/usr/bin/env bash
# Object-storage benchmark (issue 14): upload and cold-download throughput
# with bundle bytes in S3 (SeaweedFS on loopback, tests/scale/seaweedfs.sh)
# against local blobs only, in the same run, and their ratio.
#
#  * upload: `contextctl workload upload` of a SIZE MiB tree of random bytes
#    (the bundle engine, then -- with S3 -- the digest check and the object
#    write), ROUNDS distinct trees per mode; MB/s of bundle bytes, median.
#  * cold download: the first GET of each bundle after a restart with an
#    empty memory cache; with S3 the local copy is deleted first, so the
#    bytes come from object storage (fetch, verify, keep, serve). Local:
#    from the blob file (in the page cache, as on a warm host).
#  * replicas: cached download throughput at CLIENTS (32) concurrent
#    clients (wrk, DURATION s) of one bundle, through one replica and
#    through two replicas on one PostgreSQL (tests/scale/postgres.sh) and
#    one bucket, the clients split between them; MB/s and the ratio. Both
#    replicas run on this machine, so they share its cores.
#
# Usage: benches/object_storage.sh   (SIZE=64 ROUNDS=3 CLIENTS=32 DURATION=5 BIN_DIR=)
# Release builds of the service and contextctl; a private SeaweedFS (own
# state dir, stopped at the end). Everything listens on 127.0.0.1; the work
# dir is removed at the end.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

SIZE="${SIZE:-64}"
ROUNDS="${ROUNDS:-3}"
CLIENTS="${CLIENTS:-32}"
DURATION="${DURATION:-5}"
CS_PORT="${CS_PORT:-18495}"
CS_PORT2="${CS_PORT2:-18496}"
sw=tests/scale/seaweedfs.sh
pg=tests/scale/postgres.sh

for tool in curl jq; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done
if ! command -v wrk >/dev/null; then
  echo "installing wrk" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi
if [ -n "${BIN_DIR:-}" ]; then
  TARGET="$BIN_DIR"
else
  echo "building release binaries..." >&2
  cargo build --release --quiet --bin context-service --bin contextctl
  TARGET="${CARGO_TARGET_DIR:-target}/release"
fi
SERVICE="$TARGET/context-service"
CTL="$TARGET/contextctl"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/cs-s3bench.XXXXXX")"
export CONTEXT_SERVICE_SEAWEEDFS_STATE="$WORK/seaweedfs"
# Outside WORK (private to this user): the server runs as `postgres` when we are root.
CONTEXT_SERVICE_POSTGRES_STATE="$(mktemp -d "${TMPDIR:-/tmp}/cs-s3bench-pg.XXXXXX")"
export CONTEXT_SERVICE_POSTGRES_STATE
CS_PID=""
CS_PID2=""
cleanup() {
  [ -n "$CS_PID" ] && kill "$CS_PID" 2>/dev/null || true
  [ -n "$CS_PID2" ] && kill "$CS_PID2" 2>/dev/null || true
  wait 2>/dev/null || true
  "$sw" down || true
  "$pg" down || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$sw" build
"$sw" up
eval "$("$sw" env)"
URL="http://127.0.0.1:$CS_PORT"

# launch PORT DATA_DIR [BLOB_URL [DATABASE_URL]]: starts a service (a child
# of this shell, so `wait` works), its pid in LAUNCHED.
launch() {
  # An empty CS_BLOB_URL is an error, not "unset": set it only for S3.
  env ${3:+CS_BLOB_URL=$3} ${4:+CS_DATABASE_URL=$4} CS_DATA_DIR="$2" CS_LISTEN_ADDR="127.0.0.1:$1" \
    CS_BUNDLE_MAX_BYTES=$((1024 * 1024 * 1024)) CS_BUNDLE_MAX_FILE_BYTES=$((1024 * 1024 * 1024)) \
    RUST_LOG=warn "$SERVICE" serve >>"$WORK/service.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    if curl -fsS "http://127.0.0.1:$1/healthz" >/dev/null 2>&1; then
      LAUNCHED=$pid
      return 0
    fi
    sleep 0.1
  done
  echo "service did not start:" >&2
  tail -20 "$WORK/service.log" >&2
  exit 1
}

# start_service DATA_DIR [BLOB_URL]
start_service() {
  launch "$CS_PORT" "$@"
  CS_PID=$LAUNCHED
}
stop_service() {
  kill "$CS_PID"
  wait "$CS_PID" 2>/dev/null || true
  CS_PID=""
}

now() { date +%s.%N; }
mbs() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / 1e6 / s }'; }
median() { tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

for r in $(seq "$ROUNDS"); do
  mkdir -p "$WORK/src$r"
  head -c $((SIZE * 1024 * 1024)) /dev/urandom >"$WORK/src$r/data.bin"
done

declare -A UP DOWN
for mode in local s3; do
  data="$WORK/data-$mode"
  blob_url=""
  [ "$mode" = s3 ] && blob_url="s3://$CONTEXT_SERVICE_TEST_S3_BUCKET/bench-$(date +%s%N)"
  start_service "$data" "$blob_url"
  ctl() { "$CTL" --url "$URL" --data-dir "$data" "$@"; }
  ups=""
  revs=()
  bytes=()
  for r in $(seq "$ROUNDS"); do
    ctl workload create "w$r" >/dev/null
    t0=$(now)
    rev=$(ctl workload upload "w$r" "$WORK/src$r")
    t1=$(now)
    ctl workload activate "w$r" "$rev" >/dev/null
    b=$(ctl workload get "w$r" -o json | jq -r .bytes)
    revs+=("$rev")
    bytes+=("$b")
    ups="$ups $(mbs "$b" "$(echo "$t1 - $t0" | bc)")"
  done
  token=$(ctl token)
  stop_service
  [ "$mode" = s3 ] && rm -rf "$data/blobs/sha256" && mkdir -p "$data/blobs/sha256"
  start_service "$data" "$blob_url"
  downs=""
  for r in $(seq "$ROUNDS"); do
    i=$((r - 1))
    t0=$(now)
    got=$(curl -fsS -o /dev/null -w '%{size_download}' -H "Authorization: Bearer $token" \
      "$URL/v1/workloads/w$r/revisions/${revs[$i]}/bundle")
    t1=$(now)
    [ "$got" = "${bytes[$i]}" ] || { echo "w$r: got $got bytes, expected ${bytes[$i]}" >&2; exit 1; }
    downs="$downs $(mbs "$got" "$(echo "$t1 - $t0" | bc)")"
  done
  stop_service
  UP[$mode]=$(echo $ups | median)
  DOWN[$mode]=$(echo $downs | median)
  echo "$mode: upload MB/s:$ups (median ${UP[$mode]}); cold download MB/s:$downs (median ${DOWN[$mode]})"
done

# --- two replicas vs one, 32 clients ----------------------------------------
# wrk's "Transfer/sec" in MB/s (wrk prints binary units).
transfer_mbs() {
  awk '/Transfer\/sec/ {
    v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[A-Za-z]+/, "", v);
    f = (u == "GB") ? 1024 : (u == "MB") ? 1 : (u == "KB") ? 1/1024 : 1/1048576;
    printf "%.0f", v * f * 1.048576 }'
}
"$pg" up
DB_URL=$("$pg" url)
BLOB_URL="s3://$CONTEXT_SERVICE_TEST_S3_BUCKET/bench-replicas-$(date +%s%N)"
A_DIR="$WORK/replica-a"
B_DIR="$WORK/replica-b"
launch "$CS_PORT" "$A_DIR" "$BLOB_URL" "$DB_URL"
CS_PID=$LAUNCHED
# One signing key and owner-scope secret for both (a Secret in production).
mkdir -p "$B_DIR"
cp -a "$A_DIR/auth" "$B_DIR/auth"
launch "$CS_PORT2" "$B_DIR" "$BLOB_URL" "$DB_URL"
CS_PID2=$LAUNCHED
ctl() { "$CTL" --url "$URL" --data-dir "$A_DIR" "$@"; }
ctl workload create replicated >/dev/null
rev=$(ctl workload upload replicated "$WORK/src1")
ctl workload activate replicated "$rev" >/dev/null
token=$(ctl token)
DL="/v1/workloads/replicated/revisions/$rev/bundle"
for port in "$CS_PORT" "$CS_PORT2"; do
  # Warm: B fetches the bundle from the bucket, both hold it in memory.
  curl -fsS -o /dev/null -H "Authorization: Bearer $token" "http://127.0.0.1:$port$DL"
done
threads=2
half=$((CLIENTS / 2))
wrk -t"$threads" -c"$CLIENTS" -d"${DURATION}s" -H "Authorization: Bearer $token" \
  "http://127.0.0.1:$CS_PORT$DL" >"$WORK/wrk-one.txt"
wrk -t1 -c"$half" -d"${DURATION}s" -H "Authorization: Bearer $token" \
  "http://127.0.0.1:$CS_PORT$DL" >"$WORK/wrk-a.txt" &
wrk_a=$!
wrk -t1 -c"$((CLIENTS - half))" -d"${DURATION}s" -H "Authorization: Bearer $token" \
  "http://127.0.0.1:$CS_PORT2$DL" >"$WORK/wrk-b.txt"
wait "$wrk_a"
if grep -q "Non-2xx" "$WORK/wrk-one.txt" "$WORK/wrk-a.txt" "$WORK/wrk-b.txt"; then
  echo "non-2xx answers during the replica benchmark:" >&2
  cat "$WORK/wrk-one.txt" "$WORK/wrk-a.txt" "$WORK/wrk-b.txt" >&2
  exit 1
fi
ONE=$(transfer_mbs <"$WORK/wrk-one.txt")
TWO=$(($(transfer_mbs <"$WORK/wrk-a.txt") + $(transfer_mbs <"$WORK/wrk-b.txt")))

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "SIZE=${SIZE} MiB, ROUNDS=${ROUNDS}, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-14s %10s %10s %8s\n' "" "local MB/s" "s3 MB/s" "s3/local"
printf '%-14s %10s %10s %8s\n' upload "${UP[local]}" "${UP[s3]}" "$(ratio "${UP[s3]}" "${UP[local]}")"
printf '%-14s %10s %10s %8s\n' "cold download" "${DOWN[local]}" "${DOWN[s3]}" "$(ratio "${DOWN[s3]}" "${DOWN[local]}")"
echo "cached download of one ${SIZE} MiB bundle, ${CLIENTS} clients, ${DURATION}s, PostgreSQL + S3, $(nproc) cores:"
printf '%-14s %10s %10s %8s\n' "" "1 replica" "2 replicas" "2/1"
printf '%-14s %10s %10s %8s\n' "MB/s" "$ONE" "$TWO" "$(ratio "$TWO" "$ONE")"
