#!/usr/bin/env bash
# The real OCI clients the registry tests drive (tests/api/registry.rs),
# built from the Go module proxy into a cache outside the repo:
#   oras (oras.land/oras), crane (go-containerregistry), and the OCI
#   distribution-spec conformance suite (`go test -c`).
#
#   tests/oci/tools.sh bin     print the directory the binaries are in
#   tests/oci/tools.sh build   build what is missing there, then print it
#
# The directory name carries every version, so a version bump builds anew.
set -euo pipefail

ORAS_VERSION=v1.3.6
CRANE_VERSION=v0.22.1
CONFORMANCE_VERSION=v0.0.0-20260831232431-97274622c111

cache="${XDG_CACHE_HOME:-$HOME/.cache}/context-service-tools/oci"
bin="$cache/oras-${ORAS_VERSION}_crane-${CRANE_VERSION}_conformance-${CONFORMANCE_VERSION}/bin"

built() {
  [ -x "$bin/oras" ] && [ -x "$bin/crane" ] && [ -x "$bin/conformance.test" ]
}

case "${1:-}" in
  bin)
    echo "$bin"
    ;;
  build)
    if built; then
      echo "$bin"
      exit 0
    fi
    command -v go >/dev/null || { echo "tools.sh: no Go toolchain on PATH" >&2; exit 1; }
    mkdir -p "$bin"
    [ -x "$bin/oras" ] || GOBIN="$bin" go install "oras.land/oras/cmd/oras@${ORAS_VERSION}" >&2
    [ -x "$bin/crane" ] ||
      GOBIN="$bin" go install "github.com/google/go-containerregistry/cmd/crane@${CRANE_VERSION}" >&2
    if [ ! -x "$bin/conformance.test" ]; then
      # `go test -c` needs a module that requires the suite's.
      work=$(mktemp -d)
      trap 'rm -rf "$work"' EXIT
      (
        cd "$work"
        go mod init context-service-oci-conformance >/dev/null 2>&1
        go get "github.com/opencontainers/distribution-spec/conformance@${CONFORMANCE_VERSION}" >&2
        go test -c -o "$bin/conformance.test" github.com/opencontainers/distribution-spec/conformance >&2
      )
    fi
    built || { echo "tools.sh: the build left $bin incomplete" >&2; exit 1; }
    echo "$bin"
    ;;
  *)
    echo "usage: $0 bin|build" >&2
    exit 2
    ;;
esac
