#!/usr/bin/env bash
# The soak with faults (issue 37; benches/soak/src/main.rs): builds the
# service and the soak, then runs two replicas on PostgreSQL + SeaweedFS
# behind a round-robin balancer under a mixed goose load while replica A is
# killed (kill -9) and restarted, PostgreSQL restarts and S3 is unreachable
# for 30 s; checks the invariants from the stores and prints a one-screen
# summary. Exit status 0 when every invariant holds.
#
#   benches/soak.sh [--users 50] [--duration 10m] [--summary FILE] [--keep]
#   benches/soak.sh --debug ...   the dev profile (CI's short run reuses the
#                                 test build; figures come from release)
#
# Needs PostgreSQL's server binaries (tests/scale/postgres.sh) and Go for
# the first SeaweedFS build (tests/scale/seaweedfs.sh, cached).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
if [ "${1:-}" = "--debug" ]; then
	profile=debug
	shift
fi
flags=(--locked)
[ "$profile" = release ] && flags+=(--release)
target=${CARGO_TARGET_DIR:-$PWD/target}
cargo build "${flags[@]}" --bins
# The soak is a workspace of its own (benches/soak/Cargo.toml); built into
# the same target dir, beside the binaries it runs.
cargo build "${flags[@]}" --manifest-path benches/soak/Cargo.toml --target-dir "$target"
exec "$target/$profile/context-service-soak" --bin-dir "$target/$profile" --repo "$PWD" "$@"
