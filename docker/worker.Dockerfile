# syntax=docker/dockerfile:1
#
# The light worker image: the `worker` binary with the workspace tools (shell, files,
# artifacts), without the browser. Profiles light, heavy and warm run it.
#
#   docker build -f docker/worker.Dockerfile -t agent-runtime/worker:dev .
#
# (from the repository root; see docker/README.md). Add tools for the agents' shell with
# --build-arg EXTRA_PACKAGES="git curl python3".

ARG RUST_IMAGE=rust:1.95.0-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
# rust-toolchain.toml pins 1.95.0 and asks for rustfmt and clippy, which the image (a
# minimal 1.95.0) lacks: name the toolchain so rustup uses the image's as it is.
ENV RUSTUP_TOOLCHAIN=1.95.0 \
    CARGO_TARGET_DIR=/build/target \
    CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
# Without the `browser` feature (chromiumoxide is the biggest build cost and this image
# has no Chromium); `tls` keeps https:// brain URLs working.
RUN --mount=type=cache,id=agent-runtime-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=agent-runtime-target,target=/build/target,sharing=locked \
    cargo build --release --locked -p worker --no-default-features --features tls \
 && install -D -m 0755 /build/target/release/worker /out/worker

FROM ${RUNTIME_IMAGE}
ARG EXTRA_PACKAGES=""
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates ${EXTRA_PACKAGES} \
 && rm -rf /var/lib/apt/lists/*
# UID/GID 10001, as the Job's securityContext says (runAsUser, runAsGroup, fsGroup).
RUN groupadd --gid 10001 worker \
 && useradd --uid 10001 --gid 10001 --home-dir /workspace --no-create-home \
      --shell /usr/sbin/nologin worker \
 && install -d -o 10001 -g 10001 -m 0750 /workspace
COPY --from=build /out/worker /usr/local/bin/worker
# The Job mounts emptyDirs at /workspace and /tmp (the root filesystem is read-only), and
# sets BRAIN_PUBLIC_URL, WORKER_SESSION_ID and WORKER_SESSION_TOKEN.
ENV WORKER_WORKSPACE=/workspace \
    WORKER_PROFILE=light \
    HOME=/workspace
WORKDIR /workspace
USER 10001:10001
# No init: the Job shares the pod's process namespace, so its pause process is PID 1 and
# reaps the orphans of killed commands, which the worker does not (worker/README.md,
# "Running it in a pod"). An init here would keep the worker's environment, session token
# included, readable to its commands in /proc/1/environ. `docker run --init` elsewhere.
ENTRYPOINT ["/usr/local/bin/worker"]
