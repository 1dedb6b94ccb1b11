#!/usr/bin/env bash
# Benchmark of the `kube` backend through the HTTP API against the test
# control plane (tests/k8s/testenv.sh): time from POST /v1/sandbox-pools to
# `ready` for 1, 10 and 50 replicas (warm-pool and dedicated strategies), and
# create latency p50/p99 at 20 concurrent creates. Prints two tables.
#
# Brings the environment up if needed and leaves it as it found it: if this
# script started it, it stops it at the end. Extra arguments go to the test
# binary. BENCH_PROFILE=release builds the test optimised (minutes the first
# time); the default is the test profile, already built by the e2e runs.
set -euo pipefail
cd "$(dirname "$0")/.."
testenv=tests/k8s/testenv.sh

"$testenv" build
if ! "$testenv" status >/dev/null 2>&1; then
	trap '"$testenv" down' EXIT
fi
"$testenv" up
eval "$("$testenv" env)"
profile=()
[ "${BENCH_PROFILE:-}" = release ] && profile=(--release)
cargo test --locked "${profile[@]}" --features e2e --test k8s_pools_e2e -- \
	--ignored --nocapture --exact bench_pools "$@"
