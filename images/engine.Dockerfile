# The engine + sidecar image (the pod runs `kvpilot serve` and `kvpilot sidecar` from it):
#   docker build -f images/engine.Dockerfile -t ghcr.io/kvpilot/kvpilot:0.1.0 .
# The same image without a daemon: `make images` (mmdebstrap + crane, see images/README.md).
# torch from PyPI is the CUDA build: its nvidia-* wheels carry the CUDA runtime, cuBLAS and cuDNN,
# so the base stays slim Debian; the node's NVIDIA driver is mounted by the container runtime
# (NVIDIA container toolkit / device plugin). Triton compiles its kernels at start-up.

FROM python:3.11-slim-bookworm AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kvpilot ./kvpilot
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[engine,sidecar]"

FROM debian:bookworm-slim
# gcc and libc6-dev: Triton compiles its launcher stubs with the system C compiler at start-up.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*
COPY --from=wheels /wheels /tmp/wheels
RUN python3 -m venv /opt/kvpilot \
 && /opt/kvpilot/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels "kvpilot[engine,sidecar]" \
 && /opt/kvpilot/bin/pip uninstall --yes pip \
 && rm -rf /tmp/wheels \
 && echo "kvpilot:x:65532:65532:kvpilot:/tmp:/usr/sbin/nologin" >> /etc/passwd \
 && echo "kvpilot:x:65532:" >> /etc/group
ENV PATH=/opt/kvpilot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
WORKDIR /tmp
EXPOSE 8000 9400
ENTRYPOINT ["kvpilot"]
CMD ["serve", "--help"]
