# syntax=docker/dockerfile:1
#
# The brain: API, turn loop, worker channel endpoint, web chat page.
#
#   docker build -f docker/brain.Dockerfile -t agent-runtime/brain:dev .
#
# (from the repository root; see docker/README.md). Run `brain migrate` once per release
# (a Job or an init container), `brain serve` (the default command) in the Deployment.

ARG RUST_IMAGE=rust:1.95.0-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
# See worker.Dockerfile: use the image's toolchain as it is.
ENV RUSTUP_TOOLCHAIN=1.95.0 \
    CARGO_TARGET_DIR=/build/target \
    CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
# The migrations are compiled into the binary (include_str!).
RUN --mount=type=cache,id=agent-runtime-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=agent-runtime-target,target=/build/target,sharing=locked \
    cargo build --release --locked -p brain \
 && install -D -m 0755 /build/target/release/brain /out/brain

FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates tini \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 brain \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/brain --no-create-home \
      --shell /usr/sbin/nologin brain \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/brain
COPY --from=build /out/brain /usr/local/bin/brain
# Listen on every interface in a container (the API, and /metrics on a port of its own).
# The local artifact directory is for a single replica only; set
# BRAIN_ARTIFACTS_BACKEND=s3 for more (docs/CONFIGURATION.md).
ENV BRAIN_ADDR=0.0.0.0:8080 \
    BRAIN_METRICS_ADDR=0.0.0.0:9465 \
    BRAIN_ARTIFACTS_DIR=/var/lib/brain/artifacts \
    HOME=/var/lib/brain
WORKDIR /var/lib/brain
USER 10001:10001
EXPOSE 8080 9465
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/brain"]
CMD ["serve"]
