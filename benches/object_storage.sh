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
#
# Usage: benches/object_storage.sh   (SIZE=64 ROUNDS=3 BIN_DIR=)
# Release builds of the service and contextctl; a private SeaweedFS (own
# state dir, stopped at the end). Everything listens on 127.0.0.1; the work
# dir is removed at the end.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

SIZE="${SIZE:-64}"
ROUNDS="${ROUNDS:-3}"
CS_PORT="${CS_PORT:-18495}"
sw=tests/scale/seaweedfs.sh

for tool in curl jq; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done
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
CS_PID=""
cleanup() {
  [ -n "$CS_PID" ] && kill "$CS_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  "$sw" down || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$sw" build
"$sw" up
eval "$("$sw" env)"
URL="http://127.0.0.1:$CS_PORT"

# start_service DATA_DIR [BLOB_URL]
start_service() {
  # An empty CS_BLOB_URL is an error, not "unset": set it only for S3.
  env ${2:+CS_BLOB_URL=$2} CS_DATA_DIR="$1" CS_LISTEN_ADDR="127.0.0.1:$CS_PORT" \
    CS_BUNDLE_MAX_BYTES=$((1024 * 1024 * 1024)) CS_BUNDLE_MAX_FILE_BYTES=$((1024 * 1024 * 1024)) \
    RUST_LOG=warn "$SERVICE" serve >>"$WORK/service.log" 2>&1 &
  CS_PID=$!
  for _ in $(seq 1 100); do
    kill -0 "$CS_PID" 2>/dev/null || break
    curl -fsS "$URL/healthz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "service did not start:" >&2
  tail -20 "$WORK/service.log" >&2
  exit 1
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

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "SIZE=${SIZE} MiB, ROUNDS=${ROUNDS}, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-14s %10s %10s %8s\n' "" "local MB/s" "s3 MB/s" "s3/local"
printf '%-14s %10s %10s %8s\n' upload "${UP[local]}" "${UP[s3]}" "$(ratio "${UP[s3]}" "${UP[local]}")"
printf '%-14s %10s %10s %8s\n' "cold download" "${DOWN[local]}" "${DOWN[s3]}" "$(ratio "${DOWN[s3]}" "${DOWN[local]}")"
