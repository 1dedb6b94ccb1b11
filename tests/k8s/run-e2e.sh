#!/usr/bin/env bash
# Builds (cached) and starts the Kubernetes test environment, runs the
# end-to-end tests against it and always tears it down. Extra arguments go
# to the suite's test binaries, e.g. `tests/k8s/run-e2e.sh --test-threads=2`.
set -euo pipefail
cd "$(dirname "$0")/../.."
testenv=tests/k8s/testenv.sh

"$testenv" build
trap '"$testenv" down' EXIT
"$testenv" up
eval "$("$testenv" env)"
tests/k8s/deploy-check.sh
# Every service of these tests runs as the deploy's ServiceAccount with the
# RBAC of deploy/base (tests/common/rbac.rs): this run proves it grants
# enough, and is the baseline of the removal sweep after it.
cargo test --locked --features e2e --test k8s_e2e --test k8s_pools_e2e --test k8s_delivery_e2e -- "$@"
# The converse: without any one verb of those roles a mapped test fails on
# a 403 for it. The run above was its baseline.
RBAC_CHECK_BASELINE=0 tests/k8s/rbac-check.sh
