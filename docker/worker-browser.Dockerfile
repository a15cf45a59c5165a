# syntax=docker/dockerfile:1
#
# The browser worker image: the `worker` binary built with the `browser` feature, and
# Debian's Chromium with fonts. Profile browser runs it.
#
#   docker build -f docker/worker-browser.Dockerfile -t agent-runtime/worker-browser:dev .
#
# (from the repository root; see docker/README.md).

ARG RUST_IMAGE=rust:1.95.0-slim-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
# See worker.Dockerfile: use the image's toolchain as it is.
ENV RUSTUP_TOOLCHAIN=1.95.0 \
    CARGO_TARGET_DIR=/build/target \
    CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
# chromiumoxide's generated CDP types make this the slowest build of the repository
# (about 5 minutes more than the light worker on two cores).
RUN --mount=type=cache,id=agent-runtime-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=agent-runtime-target,target=/build/target,sharing=locked \
    cargo build --release --locked -p worker --no-default-features --features tls,browser \
 && install -D -m 0755 /build/target/release/worker /out/worker

FROM ${RUNTIME_IMAGE}
ARG EXTRA_PACKAGES=""
# chromium: the browser (/usr/bin/chromium). Fonts, so pages (and screenshots) render
# text: Liberation (metric-compatible with Arial/Times/Courier), DejaVu, Noto CJK and
# colour emoji. util-linux: setpriv, which the worker uses to have Chromium killed if the
# worker itself is killed.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates util-linux chromium \
      fonts-liberation fonts-dejavu-core fonts-noto-cjk fonts-noto-color-emoji \
      ${EXTRA_PACKAGES} \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 worker \
 && useradd --uid 10001 --gid 10001 --home-dir /workspace --no-create-home \
      --shell /usr/sbin/nologin worker \
 && install -d -o 10001 -g 10001 -m 0750 /workspace
COPY --from=build /out/worker /usr/local/bin/worker
# Chromium runs headless without its sandbox (a non-root pod without user namespaces
# cannot run it; the pod is the sandbox), keeps its profile in
# /workspace/.browser-profile, and writes shared memory to /tmp
# (--disable-dev-shm-usage): the Job's /tmp emptyDir must be writable.
ENV WORKER_WORKSPACE=/workspace \
    WORKER_PROFILE=browser \
    WORKER_CHROMIUM=/usr/bin/chromium \
    HOME=/workspace
WORKDIR /workspace
USER 10001:10001
# No init, as in worker.Dockerfile: the pod's pause process is PID 1.
ENTRYPOINT ["/usr/local/bin/worker"]
