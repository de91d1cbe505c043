# syntax=docker/dockerfile:1
# The `tokenfactory` image: one static-enough binary on a slim Debian, run as a non-root user.
#
#   docker build -t ghcr.io/tokenfactory/tokenfactory:0.1.0 .
#
# Stage `build` compiles the release binary with the toolchain pinned in rust-toolchain.toml (the
# tag below must match it; server/tests/dockerfile.rs checks). SQL is checked against the
# committed `.sqlx/` (SQLX_OFFLINE=true in .cargo/config.toml), so no database is needed here.
# Everything the binary needs at run time is compiled in: the migrations (sqlx::migrate!), the
# stylesheet (style/main.css), the Redis scripts, the simulator's tokenizer; the portal serves
# no files from disk. So the runtime stage holds the binary and the CA roots (S3 and Kubernetes
# API over TLS read the system's roots), nothing else.

FROM rust:1.95.0-slim-trixie AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tokenfactory \
    && install -D -m 0755 target/release/tokenfactory /out/tokenfactory

FROM debian:trixie-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 tokenfactory \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/tokenfactory \
       --shell /usr/sbin/nologin tokenfactory \
    && install -d -o 10001 -g 10001 /var/lib/tokenfactory /var/lib/tokenfactory/journal
COPY --from=build /out/tokenfactory /usr/local/bin/tokenfactory
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /var/lib/tokenfactory
# MIMALLOC_PURGE_DELAY: the allocator keeps freed pages 1 s (default 10 ms) before handing them
# back, so a busy gateway stops re-faulting fresh pages on every burst (about 2 us of CPU per small
# request in the gateway bench, issue 35).
ENV TF_LISTEN=0.0.0.0:3000 \
    TF_JOURNAL_DIR=/var/lib/tokenfactory/journal \
    MIMALLOC_PURGE_DELAY=1000
EXPOSE 3000
ENTRYPOINT ["/usr/local/bin/tokenfactory"]
CMD ["serve"]
