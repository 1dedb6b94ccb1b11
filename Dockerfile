# syntax=docker/dockerfile:1
# Build stage: compile both binaries in release mode, and the in-sandbox
# delivery agent static for both sandbox architectures (musl, linked with
# rust-lld: .cargo/config.toml).
FROM rust:1-bookworm AS build
WORKDIR /src
RUN rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl

# Dependencies first, against stub sources: this layer is rebuilt only when
# Cargo.toml or Cargo.lock change, not on every source edit. The manifest
# names the benches and e2e tests, so cargo needs those files to exist;
# empty ones do for a release build of the binaries.
COPY Cargo.toml Cargo.lock ./
COPY agent/Cargo.toml ./agent/
COPY .cargo ./.cargo
RUN mkdir -p src/bin benches tests agent/src \
 && echo 'fn main() {}' > src/bin/context-service.rs \
 && echo 'fn main() {}' > src/bin/contextctl.rs \
 && echo 'fn main() {}' > agent/src/main.rs \
 && touch src/lib.rs benches/pools.rs benches/bundle.rs benches/metadata_store.rs tests/k8s_e2e.rs tests/k8s_pools_e2e.rs \
 && cargo build --release --locked --bins \
 && rm -rf src target/release/.fingerprint/context-service-* \
      target/release/deps/context_service-* target/release/deps/libcontext_service-* \
      target/release/deps/contextctl-*

# The sources: only what the binaries are built from (the agent includes
# src/delivery/rules.rs).
COPY src ./src
# The commit, compiled in for `context_service_build_info` (src/metrics.rs).
ARG REVISION=unknown
COPY agent/src ./agent/src
RUN CONTEXT_SERVICE_GIT_COMMIT="${REVISION}" cargo build --release --locked --bins \
 && cargo build --locked -p context-agent --profile agent --target x86_64-unknown-linux-musl \
 && cargo build --locked -p context-agent --profile agent --target aarch64-unknown-linux-musl \
 && install -D -m 0755 target/release/context-service /out/context-service \
 && install -D -m 0755 target/release/contextctl /out/contextctl \
 && install -D -m 0755 target/x86_64-unknown-linux-musl/agent/context-agent /out/context-agent-x86_64 \
 && install -D -m 0755 target/aarch64-unknown-linux-musl/agent/context-agent /out/context-agent-aarch64

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
# The agents beside the service: the default --delivery-agent-dir.
COPY --from=build /out/context-service /out/contextctl /out/context-agent-x86_64 /out/context-agent-aarch64 /usr/local/bin/
# distroless's nonroot user, by number so that `runAsNonRoot` can verify it.
USER 65532:65532
ENV CS_LISTEN_ADDR=0.0.0.0:8080 \
    CS_DATA_DIR=/var/lib/context-service
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/context-service"]
CMD ["serve"]
