#!/usr/bin/env bash
# Builds (cached) and starts the Kubernetes test environment, runs the
# end-to-end tests against it and always tears it down. Extra arguments go
# to the test binary, e.g. `tests/k8s/run-e2e.sh --test-threads=2`.
set -euo pipefail
cd "$(dirname "$0")/../.."
testenv=tests/k8s/testenv.sh

"$testenv" build
trap '"$testenv" down' EXIT
"$testenv" up
eval "$("$testenv" env)"
tests/k8s/deploy-check.sh
cargo test --locked --features e2e --test k8s_e2e --test k8s_pools_e2e --test k8s_delivery_e2e -- "$@"
