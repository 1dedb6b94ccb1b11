#!/usr/bin/env bash
# Delivery benchmark (issue 9): frozen revisions into running sandboxes.
#
#  1. 64 MiB and 256 MiB trees (half random bytes, a quarter base64 text, a
#     quarter log-like text), each published as a workload. Cold delivery
#     (bytes sent) and warm delivery (another run: a verified cache hit,
#     default verify) on the `local` backend and through kube exec into a
#     kwok pod of the test control plane, side by side with `kubectl cp` of
#     the same extracted tree into the same pod, in the same run.
#  2. Peak RSS (VmHWM) of a fresh gateway process during 8 concurrent cold
#     deliveries of 8 distinct 256 MiB bundles into 8 sandboxes, against
#     cache budget + in-flight budget + 128 MiB.
#  3. On `local`, every round twice: through the script
#     (CS_DELIVERY_TRANSPORT=script) and through the injected agent (the
#     static release build of agent/, in CS_DELIVERY_AGENT_DIR), with the
#     script/agent ratio of the cold times. The kube rounds use the agent.
#
# Usage: benches/delivery.sh      (SIZES="64 256" ROUNDS=1 CONCURRENT=8 BIN_DIR= LOCAL_ONLY=)
# LOCAL_ONLY=1 skips the control plane (the kube rounds and the memory run).
# Release builds of the service and contextctl; brings tests/k8s/testenv.sh
# up when needed and stops it at the end only if it started it. Everything
# listens on 127.0.0.1; the work dir and the bench namespace are removed at
# the end.
#
# kwok runs exec'd commands as local processes on this host and never closes
# their stdin. `kubectl cp` runs `tar -xmf -` in the pod, and GNU tar reading
# a pipe waits to fill its last 10 KiB record, which never comes: it hangs
# after extracting everything. For the `kubectl cp` step the pod's kwok Exec
# rule sets TAR_OPTIONS=--blocking-factor=1 (512-byte records, so the last
# record is always full). That costs tar extra read calls; the script
# measures that cost locally on the same tree and subtracts it before
# computing the ratio, so the ratio favours `kubectl cp`, never us.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

SIZES="${SIZES:-64 256}"
ROUNDS="${ROUNDS:-1}"
CONCURRENT="${CONCURRENT:-8}"
CACHE_MIB="${CACHE_MIB:-512}"
INFLIGHT_MIB="${INFLIGHT_MIB:-512}"
CS_PORT="${CS_PORT:-18490}"
testenv=tests/k8s/testenv.sh

for tool in curl jq; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

# BIN_DIR: prebuilt context-service and contextctl (e.g. another commit's,
# for a before/after run) instead of building this checkout's.
if [ -n "${BIN_DIR:-}" ]; then
  TARGET="$BIN_DIR"
else
  echo "building release binaries..." >&2
  cargo build --release --quiet --bin context-service --bin contextctl
  TARGET="${CARGO_TARGET_DIR:-target}/release"
fi
SERVICE="$TARGET/context-service"
CTL="$TARGET/contextctl"
ARCH="$(uname -m)"
echo "building the $ARCH agent..." >&2
cargo build --quiet -p context-agent --profile agent --target "$ARCH-unknown-linux-musl"
AGENT_BIN="${CARGO_TARGET_DIR:-target}/$ARCH-unknown-linux-musl/agent/context-agent"

LOCAL_ONLY="${LOCAL_ONLY:-}"
STARTED_ENV=""
if [ -z "$LOCAL_ONLY" ]; then
  "$testenv" build
  if ! "$testenv" status >/dev/null 2>&1; then
    STARTED_ENV=1
  fi
  "$testenv" up
  eval "$("$testenv" env)"
  KUBECTL="$CONTEXT_SERVICE_TESTENV_BIN/kubectl"
else
  KUBECTL=true
  CONTEXT_SERVICE_TESTENV_EXEC_ROOT=/nonexistent
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/cs-delivery-bench.XXXXXX")"
NS="cs-delivery-bench-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
# Sources, blobs, and the trees extracted in up to $CONCURRENT sandboxes.
need_gib=$(( 3 + CONCURRENT * 3 / 4 ))
free_kb=$(df -Pk "$WORK" | awk 'NR == 2 {print $4}')
if [ "$free_kb" -lt $((need_gib * 1024 * 1024)) ]; then
  echo "need $need_gib GiB free under $WORK, have $((free_kb / 1024)) MiB" >&2
  rmdir "$WORK"
  exit 1
fi

CS_PID=""
cleanup() {
  [ -n "$CS_PID" ] && kill "$CS_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  "$KUBECTL" delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  for d in "$WORK" "$CONTEXT_SERVICE_TESTENV_EXEC_ROOT/$NS"; do
    [ -d "$d" ] && chmod -R u+w "$d" 2>/dev/null
    rm -rf "$d"
  done
  [ -n "$STARTED_ENV" ] && "$testenv" down || true
}
trap cleanup EXIT

export CS_DATA_DIR="$WORK/data"
mkdir -p "$WORK/agents"
cp "$AGENT_BIN" "$WORK/agents/context-agent-$ARCH"
URL="http://127.0.0.1:$CS_PORT"
ctl() { "$CTL" --url "$URL" --data-dir "$CS_DATA_DIR" "$@"; }
now() { date +%s%N; }
ms_since() { echo $(( ($(now) - $1) / 1000000 )); }
secs() { awk -v ms="$1" 'BEGIN { printf "%.2f", ms / 1000 }'; }

# start_service BACKEND [TRANSPORT]: a fresh gateway process (transport
# exec: the agent; script: the script).
start_service() {
  local backend=$1 transport=${2:-exec}
  CS_DELIVERY_TRANSPORT="$transport" CS_DELIVERY_AGENT_DIR="$WORK/agents" \
  CS_LISTEN_ADDR="127.0.0.1:$CS_PORT" CS_BACKEND="$backend" CS_NAMESPACE="$NS" \
    CS_SANDBOX_IMAGE=busybox:stable CS_DELIVERY_ROOT=.context \
    CS_CACHE_BYTES=$((CACHE_MIB << 20)) CS_DELIVERY_INFLIGHT_BYTES=$((INFLIGHT_MIB << 20)) \
    RUST_LOG=warn "$SERVICE" serve >>"$WORK/service.log" 2>&1 &
  CS_PID=$!
  for _ in $(seq 1 300); do
    curl -fsS "$URL/healthz" >/dev/null 2>&1 && { TOKEN="$(ctl token)"; return 0; }
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

api() { # METHOD PATH [BODY] -> body on stdout; fails on a non-2xx answer
  local out
  out=$(curl -sS -X "$1" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
    ${3:+-d "$3"} -w '\n%{http_code}' --max-time 900 "$URL$2")
  local code=${out##*$'\n'}
  local body=${out%$'\n'*}
  if [ "${code:0:1}" != 2 ]; then
    echo "$1 $2 answered $code: $body" >&2
    tail -5 "$WORK/service.log" >&2
    return 1
  fi
  printf '%s\n' "$body"
}

# make_tree DIR MIB SEED: per 8 MiB, 4 MiB random, 2 MiB base64, 2 MiB log text.
make_tree() {
  local dir=$1 mib=$2 seed=$3 i=0
  mkdir -p "$dir/bin" "$dir/text" "$dir/logs"
  while [ $((i * 8)) -lt "$mib" ]; do
    head -c 4M /dev/urandom >"$dir/bin/part-$i.bin"
    # The producers stop on SIGPIPE once `head` has its bytes (pipefail).
    { base64 -w 76 /dev/urandom || true; } | head -c 2M >"$dir/text/part-$i.txt"
    { awk -v seed="$seed" 'BEGIN { for (n = 1; n <= 40000; n++)
      printf "%d %s INFO request served in %d ms path=/v1/items/%d status=200\n", n, seed, n % 97, n * 7 }' ||
      true; } | head -c 2M >"$dir/logs/part-$i.log"
    i=$((i + 1))
  done
  echo "$seed" >"$dir/id.txt"
}

# publish NAME DIR: uploads and activates; prints the bundle size in bytes.
publish() {
  ctl workload create "$1" >/dev/null
  local rev
  rev="$(ctl workload upload "$1" "$2")"
  ctl workload activate "$1" "$rev" >/dev/null
  ctl --output json workload get "$1" | jq -er '.bytes'
}

# create_pool NAME REPLICAS: waits for ready; prints "sandbox pod" lines.
create_pool() {
  api POST /v1/sandbox-pools \
    "{\"name\":\"$1\",\"replicas\":$2,\"workspace\":{\"size\":\"1Gi\",\"accessMode\":\"ReadWriteMany\"}}" >/dev/null
  api GET "/v1/sandbox-pools/$1?wait=ready&timeout=120s" |
    jq -r 'if .status == "ready" then .sandboxes[] | "\(.name) \(.pod // "-")" else error("pool not ready: \(.)") end'
}

# exec_rule POD [TAR_OPTIONS]: lets kwok run the pod's execs in its work dir.
exec_rule() {
  local pod=$1 envs=""
  [ -n "${2:-}" ] && envs=", envs: [{name: TAR_OPTIONS, value: \"$2\"}]"
  mkdir -p "$CONTEXT_SERVICE_TESTENV_EXEC_ROOT/$NS/$pod"
  "$KUBECTL" apply -f - >/dev/null <<EOF
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Exec
metadata: {name: $pod, namespace: $NS}
spec:
  execs: [{containers: [sandbox], local: {workDir: "$CONTEXT_SERVICE_TESTENV_EXEC_ROOT/$NS/$pod"$envs}}]
EOF
  # kwok follows rules through a watch.
  sleep 1
}

# deliver WORKLOAD RUN SANDBOX: prints "wall_ms duration_ms bytes_sent cached transport".
deliver() {
  local t0 body
  t0=$(now)
  body=$(api POST "/v1/workloads/$1/deliveries" "{\"runId\":\"$2\",\"sandbox\":\"$3\"}")
  local wall
  wall=$(ms_since "$t0")
  printf '%s %s\n' "$wall" "$(jq -r '.deliveries[0] | "\(.durationMs) \(.bytesSent) \(.cached) \(.transport)"' <<<"$body")"
}

release() { api DELETE "/v1/workloads/$1/deliveries/$2" >/dev/null; }

echo "preparing trees of $SIZES MiB..." >&2
for s in $SIZES; do make_tree "$WORK/src$s" "$s" "$s"; done

# What TAR_OPTIONS=--blocking-factor=1 costs tar on each tree, here.
declare -A TAR_PENALTY_MS
for s in $SIZES; do
  tar -cf "$WORK/t.tar" -C "$WORK/src$s" .
  best=""
  for opt in "" "--blocking-factor=1"; do
    mkdir -p "$WORK/x"
    cat "$WORK/t.tar" >/dev/null
    t0=$(now)
    cat "$WORK/t.tar" | tar $opt -xmf - -C "$WORK/x"
    took=$(ms_since "$t0")
    rm -rf "$WORK/x"
    if [ -z "$best" ]; then best=$took; else TAR_PENALTY_MS[$s]=$(( took > best ? took - best : 0 )); fi
  done
  rm -f "$WORK/t.tar"
done

# The verification floor: what the checks the in-sandbox script must make
# cost on this host's tools, alone, with both cores: sha256 of the bundle
# beside inflate + sha256 of the tar. No cold delivery can be faster than
# this plus the transfer, whatever the gateway does.
declare -A FLOOR_MS GUNZIP_MS SHA_MS
best_of3() { # CMD...: the best wall time of three runs, in ms
  local best="" t0 took
  for _ in 1 2 3; do
    t0=$(now)
    "$@"
    took=$(ms_since "$t0")
    if [ -z "$best" ] || [ "$took" -lt "$best" ]; then best=$took; fi
  done
  echo "$best"
}
floor_checks() { { sha256sum "$1" >/dev/null & } ; gzip -dc "$1" | sha256sum >/dev/null; wait; }
for s in $SIZES; do
  "$CTL" bundle pack "$WORK/src$s" -f "$WORK/floor.tar.gz" >/dev/null
  cat "$WORK/floor.tar.gz" >/dev/null
  FLOOR_MS[$s]=$(best_of3 floor_checks "$WORK/floor.tar.gz")
  GUNZIP_MS[$s]=$(best_of3 sh -c 'gzip -dc "$1" >/dev/null' sh "$WORK/floor.tar.gz")
  gzip -dc "$WORK/floor.tar.gz" >"$WORK/floor.tar"
  SHA_MS[$s]=$(best_of3 sh -c 'sha256sum "$1" >/dev/null' sh "$WORK/floor.tar")
  rm -f "$WORK/floor.tar.gz" "$WORK/floor.tar"
done

declare -A ROWS
BUNDLE_MIB=()

# --- local --------------------------------------------------------------------
# The same data dir for both transports: the workloads are published once.
for t in script agent; do
  if [ "$t" = script ]; then start_service local script; else start_service local exec; fi
  if [ "$t" = script ]; then
    for s in $SIZES; do
      bytes=$(publish "w$s" "$WORK/src$s")
      BUNDLE_MIB+=("$s:$(awk -v b="$bytes" 'BEGIN { printf "%.0f", b / 1048576 }')")
    done
    read -r LSANDBOX _ < <(create_pool bench 1)
  fi
  # The agent's first delivery injects it: done before the rounds.
  [ "$t" = agent ] && { deliver "w${SIZES%% *}" "inject" "$LSANDBOX" >/dev/null; release "w${SIZES%% *}" inject; }
  for s in $SIZES; do
    for r in $(seq 1 "$ROUNDS"); do
      read -r cw cd cb cc ct < <(deliver "w$s" "lc$s-$r" "$LSANDBOX")
      read -r ww wd wb wc wt < <(deliver "w$s" "lw$s-$r" "$LSANDBOX")
      [ "$cc" = false ] && [ "$wc" = true ] && [ "$wb" = 0 ] || { echo "local $s: unexpected cold/warm outcome" >&2; exit 1; }
      [ "$ct" = "$t" ] && [ "$wt" = "$t" ] || { echo "local $s: delivered by $ct/$wt, not $t" >&2; exit 1; }
      release "w$s" "lc$s-$r"; release "w$s" "lw$s-$r"
      ROWS["local-$t $s $r"]="$cw $cd $ww $wd"
    done
  done
  stop_service
done
if [ -n "$LOCAL_ONLY" ]; then
  echo
  echo "== local delivery, script vs agent: cold (bytes sent) and warm (hit, default verify); $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg) =="
  printf "%5s %7s %5s | %9s %9s | %9s %9s | %s\n" tree bundle round "script s" "agent s" "script ms" "agent ms" "cold script/agent"
  bundle_mib() { local e; for e in "${BUNDLE_MIB[@]}"; do [ "${e%%:*}" = "$1" ] && echo "${e#*:}"; done; }
  for s in $SIZES; do
    for r in $(seq 1 "$ROUNDS"); do
      read -r scw _ sww _ <<<"${ROWS["local-script $s $r"]}"
      read -r acw _ aww _ <<<"${ROWS["local-agent $s $r"]}"
      printf "%4sM %6sM %5s | %9s %9s | %9s %9s | %.2fx\n" "$s" "$(bundle_mib "$s")" "$r" \
        "$(secs "$scw")" "$(secs "$acw")" "$sww" "$aww" "$(awk -v a="$scw" -v b="$acw" 'BEGIN { print a / b }')"
    done
  done
  echo "(wall = HTTP round trip; LOCAL_ONLY: no control plane, no kube rounds, no memory run)"
  exit 0
fi

# --- kube ------------------------------------------------------------------------
"$KUBECTL" create namespace "$NS" >/dev/null
for _ in $(seq 1 100); do
  "$KUBECTL" -n "$NS" get serviceaccount default >/dev/null 2>&1 && break
  sleep 0.2
done
start_service kube
read -r KSANDBOX KPOD < <(create_pool bench 1)
exec_rule "$KPOD"
KWORK="$CONTEXT_SERVICE_TESTENV_EXEC_ROOT/$NS/$KPOD"
for s in $SIZES; do
  for r in $(seq 1 "$ROUNDS"); do
    read -r cw cd cb cc _ < <(deliver "w$s" "kc$s-$r" "$KSANDBOX")
    read -r ww wd wb wc _ < <(deliver "w$s" "kw$s-$r" "$KSANDBOX")
    [ "$cc" = false ] && [ "$wc" = true ] && [ "$wb" = 0 ] || { echo "kube $s: unexpected cold/warm outcome" >&2; exit 1; }
    release "w$s" "kc$s-$r"; release "w$s" "kw$s-$r"
    exec_rule "$KPOD" --blocking-factor=1
    t0=$(now)
    "$KUBECTL" cp "$WORK/src$s" "$NS/$KPOD:kcp-$s-$r" -c sandbox
    kw=$(ms_since "$t0")
    exec_rule "$KPOD"
    got=$(du -sb "$KWORK/kcp-$s-$r" | cut -f1)
    want=$(du -sb "$WORK/src$s" | cut -f1)
    [ "$got" = "$want" ] || { echo "kubectl cp copied $got of $want bytes" >&2; exit 1; }
    rm -rf "$KWORK/kcp-$s-$r"
    ROWS["kube $s $r"]="$cw $cd $ww $wd $kw"
  done
done

# --- memory ------------------------------------------------------------------------
echo "preparing $CONCURRENT distinct 256 MiB bundles..." >&2
[ -d "$WORK/src256" ] || make_tree "$WORK/src256" 256 256
for i in $(seq 1 "$CONCURRENT"); do
  d="$WORK/m$i"
  mkdir -p "$d"
  cp -al "$WORK/src256/." "$d/"
  rm -f "$d/id.txt"
  echo "bundle $i" >"$d/id.txt"
  publish "m$i" "$d" >/dev/null
  rm -rf "$d"
done
mapfile -t MEMBERS < <(create_pool mem "$CONCURRENT")
for m in "${MEMBERS[@]}"; do exec_rule "${m#* }"; done
# A fresh process: its VmHWM covers the deliveries only.
stop_service
start_service kube
RSS_IDLE_KB=$(awk '/VmRSS/ {print $2}' "/proc/$CS_PID/status")
t0=$(now)
pids=()
for i in $(seq 1 "$CONCURRENT"); do
  sandbox=${MEMBERS[$((i - 1))]%% *}
  deliver "m$i" "mem-$i" "$sandbox" >"$WORK/mem-$i.out" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
MEM_MS=$(ms_since "$t0")
PEAK_KB=$(awk '/VmHWM/ {print $2}' "/proc/$CS_PID/status")
for i in $(seq 1 "$CONCURRENT"); do
  read -r _ _ b c _ <"$WORK/mem-$i.out"
  [ "$c" = false ] && [ "$b" -gt 0 ] || { echo "memory delivery $i: not a cold delivery" >&2; exit 1; }
  release "m$i" "mem-$i"
done

# --- report ----------------------------------------------------------------------
bundle_mib() { local e; for e in "${BUNDLE_MIB[@]}"; do [ "${e%%:*}" = "$1" ] && echo "${e#*:}"; done; }
echo
echo "== delivery: cold (bytes sent) and warm (hit, default verify); wall = HTTP round trip; $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg) =="
printf "%-6s %5s %7s %5s | %9s %9s | %9s %9s | %11s %9s %7s\n" \
  backend tree bundle round "cold s" "(script)" "warm ms" "(script)" "kubectl cp" "-b1 cost" ratio
for s in $SIZES; do
  for t in script agent; do
    for r in $(seq 1 "$ROUNDS"); do
      read -r cw cd ww wd <<<"${ROWS["local-$t $s $r"]}"
      printf "%-6s %4sM %6sM %5s | %9s %9s | %9s %9s | %11s %9s %7s\n" \
        "l-$t" "$s" "$(bundle_mib "$s")" "$r" "$(secs "$cw")" "$(secs "$cd")" "$ww" "$wd" - - -
    done
  done
  for r in $(seq 1 "$ROUNDS"); do
    read -r cw cd ww wd kw <<<"${ROWS["kube $s $r"]}"
    pen=${TAR_PENALTY_MS[$s]}
    ratio=$(awk -v k="$kw" -v p="$pen" -v c="$cw" 'BEGIN { printf "%.2f", (k - p) / c }')
    printf "%-6s %4sM %6sM %5s | %9s %9s | %9s %9s | %10ss %8ss %6sx\n" \
      kube "$s" "$(bundle_mib "$s")" "$r" "$(secs "$cw")" "$(secs "$cd")" "$ww" "$wd" \
      "$(secs "$kw")" "$(secs "$pen")" "$ratio"
  done
done
echo "ratio = (kubectl cp - its -b1 cost) / cold delivery; target >= 1.5. Warm target: < 100 ms for 64 MiB."
echo
echo "== verification floor on this host (the script's tools, best of 3, page cache warm) =="
printf "%5s | %12s %18s %24s | %s\n" tree "gzip -dc" "sha256sum of tar" "sha256 ∥ gzip -dc|sha256" "best ratio any cold delivery can reach"
for s in $SIZES; do
  # Against the last round's kubectl cp (less its -b1 cost).
  read -r _ _ _ _ kw <<<"${ROWS["kube $s $ROUNDS"]}"
  pen=${TAR_PENALTY_MS[$s]}
  printf "%4sM | %11ss %17ss %23ss | %s\n" "$s" "$(secs "${GUNZIP_MS[$s]}")" "$(secs "${SHA_MS[$s]}")" \
    "$(secs "${FLOOR_MS[$s]}")" "$(awk -v k="$kw" -v p="$pen" -v f="${FLOOR_MS[$s]}" 'BEGIN { printf "%.2fx", (k - p) / f }')"
done
echo "(the third column is the least a verified cold delivery costs before a byte is sent or extracted)"
LIMIT_KB=$(( (CACHE_MIB + INFLIGHT_MIB + 128) * 1024 ))
echo
echo "== memory: $CONCURRENT concurrent cold deliveries of distinct $(bundle_mib 256 || echo 256)M bundles (256 MiB trees) through kube exec =="
echo "all delivered in $(secs "$MEM_MS") s; idle RSS $((RSS_IDLE_KB / 1024)) MiB; peak RSS $((PEAK_KB / 1024)) MiB;" \
  "limit (cache $CACHE_MIB + in-flight $INFLIGHT_MIB + 128 MiB) $((LIMIT_KB / 1024)) MiB"
if [ "$PEAK_KB" -le "$LIMIT_KB" ]; then echo "memory: PASS"; else echo "memory: FAIL"; exit 1; fi
