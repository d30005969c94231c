# syntax=docker/dockerfile:1
# gpuagent container image: `docker build -t gpuagent:0.1.0 .` (the tag deploy/*.yaml uses).
#
# User. The image runs as an unprivileged user (gpuagent, uid 10001, in the video group) by default:
# enough to monitor (mode off) and to serve the scheduler extender, provided the /dev/nvidia* nodes the
# NVIDIA runtime adds are readable by it (mode 0666, the driver's default, or group video). Two things
# need root (uid 0) with CAP_KILL, which deploy/daemonset.yaml sets with runAsUser: 0:
# - freezing other pods' cgroups (mode enforce): cgroup.freeze is owned by root on the host;
# - signalling other pods' processes (the memory ladder's TERM/KILL): kill(2) across users needs CAP_KILL.
# See deploy/README.md.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the wheel is built from (.dockerignore keeps the rest of the tree out of the context).
COPY pyproject.toml README.md ./
COPY gpuagent ./gpuagent
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/gpuagent \
 && /opt/gpuagent/bin/pip install /wheels/gpuagent-*.whl \
 && /opt/gpuagent/bin/pip uninstall --yes pip

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="gpuagent" \
      org.opencontainers.image.description="Node-level GPU monitoring and isolation agent" \
      org.opencontainers.image.licenses="Apache-2.0"
# The venv only: its python is the base image's /usr/local/bin/python3.11, the same in both stages.
COPY --from=builder /opt/gpuagent /opt/gpuagent
RUN groupadd --system --gid 10001 gpuagent \
 && useradd --system --uid 10001 --gid gpuagent --groups video --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin gpuagent \
 && install -d -o gpuagent -g gpuagent -m 0700 /var/lib/gpuagent
# The NVIDIA container runtime mounts every GPU and NVML (libnvidia-ml: the "utility" capability);
# nothing of the CUDA stack is needed.
ENV PATH=/opt/gpuagent/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER 10001:10001
EXPOSE 9402
# /healthz on the port GPUAGENT_LISTEN names (default 0.0.0.0:9402), with urllib (slim has no curl) and
# no proxy. A 503 (the poller is stuck) raises HTTPError: a non-zero exit, the container turns unhealthy.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as r; h, _, p = os.environ.get('GPUAGENT_LISTEN', '0.0.0.0:9402').rpartition(':'); h = h.strip('[]'); h = {'': '127.0.0.1', '0.0.0.0': '127.0.0.1', '::': '::1'}.get(h, h); r.build_opener(r.ProxyHandler({})).open('http://%s:%s/healthz' % ('[%s]' % h if ':' in h else h, p), timeout=4)"]
# --backend nvml: the real driver or nothing. Without NVML the agent keeps retrying, /readyz answers 503 with
# the reason and no GPU figure is served; it never falls back to the simulator (backend auto would).
ENTRYPOINT ["gpuagent", "run", "--backend", "nvml"]
