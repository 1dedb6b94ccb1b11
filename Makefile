.PHONY: e2e oci s3 soak soak-short test-postgres

# The API tests again with every test server keeping its metadata on
# PostgreSQL (a throwaway cluster per test process, a database per server;
# see tests/common/postgres.rs). Tests that read the embedded store's file
# themselves stay on it.
test-postgres:
	CONTEXT_SERVICE_TEST_DATABASE=postgres cargo test --locked --test api

# End-to-end tests against a real control plane (see tests/k8s/README.md).
e2e:
	tests/k8s/run-e2e.sh

# Object-storage tests against a real S3 server, SeaweedFS built from the Go
# module proxy (see tests/scale/seaweedfs.sh).
s3:
	tests/scale/run-s3.sh

# The OCI pull API (/v2) against real clients: oras, crane and the
# distribution-spec conformance suite, built from the Go module proxy once
# and cached outside the repo (tests/oci/tools.sh). CI=1 makes a missing
# tool a failure instead of a skip.
oci:
	tests/oci/tools.sh build
	CI=1 cargo test --locked --test api registry:: -- --nocapture

# The soak with faults on the scale-out stack (benches/soak.sh; figures in
# docs/benchmarks.md): 50 users for 10 minutes, release build.
soak:
	benches/soak.sh

# CI's short soak: the soak's own unit tests, then 16 users for 3 minutes
# on the dev build the tests already made, every fault included.
soak-short:
	cargo test --locked --manifest-path benches/soak/Cargo.toml --target-dir "$${CARGO_TARGET_DIR:-target}"
	benches/soak.sh --debug --users 16 --duration 3m
