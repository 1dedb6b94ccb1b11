# syntax=docker/dockerfile:1
# Build stage: compile both binaries in release mode.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY tests ./tests
RUN cargo build --release --locked --bins \
 && install -D -m 0755 target/release/context-service /out/context-service \
 && install -D -m 0755 target/release/contextctl /out/contextctl

# Runtime stage: distroless (glibc, CA certificates), non-root, no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/context-service /out/contextctl /usr/local/bin/
USER nonroot:nonroot
ENV CS_LISTEN_ADDR=0.0.0.0:8080 \
    CS_DATA_DIR=/var/lib/context-service
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/context-service"]
CMD ["serve"]
