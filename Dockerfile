# syntax=docker/dockerfile:1
# Build stage: compile both binaries in release mode.
FROM rust:1-bookworm AS build
WORKDIR /src

# Dependencies first, against stub sources: this layer is rebuilt only when
# Cargo.toml or Cargo.lock change, not on every source edit. The manifest
# names the benches and e2e tests, so cargo needs those files to exist;
# empty ones do for a release build of the binaries.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src/bin benches tests \
 && echo 'fn main() {}' > src/bin/context-service.rs \
 && echo 'fn main() {}' > src/bin/contextctl.rs \
 && touch src/lib.rs benches/pools.rs benches/bundle.rs benches/metadata_store.rs tests/k8s_e2e.rs tests/k8s_pools_e2e.rs \
 && cargo build --release --locked --bins \
 && rm -rf src target/release/.fingerprint/context-service-* \
      target/release/deps/context_service-* target/release/deps/libcontext_service-* \
      target/release/deps/contextctl-*

# The sources: only what the binaries are built from.
COPY src ./src
# The commit, compiled in for `context_service_build_info` (src/metrics.rs).
ARG REVISION=unknown
RUN CONTEXT_SERVICE_GIT_COMMIT="${REVISION}" cargo build --release --locked --bins \
 && install -D -m 0755 target/release/context-service /out/context-service \
 && install -D -m 0755 target/release/contextctl /out/contextctl

# Runtime stage: distroless (glibc, CA certificates), non-root, no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="context-service" \
      org.opencontainers.image.description="Allocation engine and context gateway for AI-agent sandboxes on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"
COPY --from=build /out/context-service /out/contextctl /usr/local/bin/
# distroless's nonroot user, by number so that `runAsNonRoot` can verify it.
USER 65532:65532
ENV CS_LISTEN_ADDR=0.0.0.0:8080 \
    CS_DATA_DIR=/var/lib/context-service
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/context-service"]
CMD ["serve"]
