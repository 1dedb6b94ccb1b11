#!/usr/bin/env bash
# Builds (cached) and starts SeaweedFS on loopback with a private state dir,
# runs the object-storage tests against it and always stops it:
#   1. the blob store on object_store's S3 backend (tests/api/object_blobs.rs);
#   1b. context-service migrate into PostgreSQL + S3 (tests/migrate.rs, with a
#      private SeaweedFS);
#   2. an outage and its recovery (tests/object_storage_outage.rs, with a
#      second, private SeaweedFS it stops and starts);
#   3. the workload-related API suite again, every spawned service keeping
#      its bundles under its own prefix of the test bucket
#      (CONTEXT_SERVICE_TEST_BLOBS=s3), with tests/api/object_storage.rs and
#      tests/api/replicas.rs (two replicas on PostgreSQL + one bucket);
#   4. the same suite once more as a scaled-out deployment runs: metadata on
#      PostgreSQL and bundles in S3 together.
# Extra arguments go to the test binaries, e.g. `--test-threads=2`.
set -euo pipefail
cd "$(dirname "$0")/../.."
sw=tests/scale/seaweedfs.sh

"$sw" build
export CONTEXT_SERVICE_SEAWEEDFS_STATE=${CONTEXT_SERVICE_SEAWEEDFS_STATE:-$(mktemp -d)}
trap '"$sw" down' EXIT
"$sw" up
eval "$("$sw" env)"
# A missing or misconfigured server fails these tests instead of skipping them.
export CONTEXT_SERVICE_REQUIRE_S3=1
cargo test --locked --test api -- "$@" object_blobs::
cargo test --locked --test object_storage_outage --test migrate -- "$@"
# The parts of the API suite that store, read or deliver bundles. Local-only
# (skipped here, said in their output): workloads_recovery::recovery_after_a_crash
# deletes a blob file and expects the workload to fail. The delivery script
# tests never touch a blob but their names match `deliveries`: skipped.
suite=(workloads contexts deliveries owners trusted upload_limits quotas
	compat_delete contextctl_workload object_storage replicas)
not_blobs=(--skip delivery_script::)
CONTEXT_SERVICE_TEST_BLOBS=s3 cargo test --locked --test api -- "$@" "${suite[@]}" "${not_blobs[@]}"
CONTEXT_SERVICE_TEST_BLOBS=s3 CONTEXT_SERVICE_TEST_DATABASE=postgres \
	cargo test --locked --test api -- "$@" "${suite[@]}" "${not_blobs[@]}"
