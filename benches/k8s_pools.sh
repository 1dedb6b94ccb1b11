#!/usr/bin/env bash
# Benchmark of the `kube` backend through the HTTP API against the test
# control plane (tests/k8s/testenv.sh): time from POST /v1/sandbox-pools to
# `ready` for 1, 10 and 50 replicas of the warm, shared and dedicated
# strategies, the `?wait=ready` wake lag (answer minus the moment the bench's
# own watch saw the last member Ready), and 20 concurrent creates then
# deletes: p50/p99 per repetition and the worst p99. Prints two tables.
#
# Brings the environment up if needed and leaves it as it found it: if this
# script started it, it stops it at the end. Extra arguments go to the test
# binary. BENCH_REPS=n repetitions of every row (default 3);
# BENCH_STORAGE_CLASS=name puts managed workspaces on that class (the test
# environment has `standard`, Immediate, the default, and `wait-for-consumer`,
# WaitForFirstConsumer); BENCH_STRATEGIES=warm,shared picks strategies
# (default all three); BENCH_REPLICAS=10 picks the one-pool sizes (default
# 1,10,50); BENCH_CONCURRENT=0 skips the 20-concurrent rows. The service is
# built optimised, as users run it (BENCH_PROFILE=test: the unoptimised test
# profile the e2e runs already built).
set -euo pipefail
cd "$(dirname "$0")/.."
testenv=tests/k8s/testenv.sh

"$testenv" build
if ! "$testenv" status >/dev/null 2>&1; then
	trap '"$testenv" down' EXIT
fi
"$testenv" up
eval "$("$testenv" env)"
profile=(--release)
[ "${BENCH_PROFILE:-release}" = test ] && profile=()
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores" >&2
cargo test --locked "${profile[@]}" --features e2e --test k8s_pools_e2e -- \
	--ignored --nocapture --exact bench::bench_pools "$@"
