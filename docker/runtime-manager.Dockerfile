# syntax=docker/dockerfile:1
#
# The runtime-manager: consumes provision/teardown tasks and launches workers as
# Kubernetes Jobs (RUNTIME_MANAGER_LAUNCHER=kubernetes).
#
#   docker build -f docker/runtime-manager.Dockerfile -t agent-runtime/runtime-manager:dev .
#
# (from the repository root; see docker/README.md). The worker binary is not in this
# image: it is needed only by the local launcher (workers as child processes, for a
# laptop), while in a cluster every worker is a Job running the worker images.

ARG RUST_IMAGE=rust:1.95.0-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
# See worker.Dockerfile: use the image's toolchain as it is.
ENV RUSTUP_TOOLCHAIN=1.95.0 \
    CARGO_TARGET_DIR=/build/target \
    CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
RUN --mount=type=cache,id=agent-runtime-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=agent-runtime-target,target=/build/target,sharing=locked \
    cargo build --release --locked -p runtime-manager \
 && install -D -m 0755 /build/target/release/runtime-manager /out/runtime-manager

FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates tini \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 manager \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/runtime-manager --no-create-home \
      --shell /usr/sbin/nologin manager \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/runtime-manager
COPY --from=build /out/runtime-manager /usr/local/bin/runtime-manager
# Metrics on every interface of the pod: the default (loopback) is for a laptop.
ENV RUNTIME_MANAGER_LAUNCHER=kubernetes \
    RUNTIME_MANAGER_METRICS_ADDR=0.0.0.0:9464 \
    HOME=/var/lib/runtime-manager
WORKDIR /var/lib/runtime-manager
USER 10001:10001
EXPOSE 9464
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/runtime-manager"]
