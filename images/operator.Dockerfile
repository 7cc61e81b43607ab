# The kvpilot operator image, for builders with a Docker daemon or BuildKit:
#   docker build -f images/operator.Dockerfile -t ghcr.io/kvpilot/kvpilot-operator:0.1.0 .
# The same image without a daemon: `make images` (mmdebstrap + crane, see images/README.md).
# kvpilot[operator] only: kopf, the Kubernetes client, httpx, prometheus-client and the pure
# capacity planner; the operator never imports torch.

FROM python:3.11-slim-bookworm AS wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kvpilot ./kvpilot
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*
COPY --from=wheels /wheels /tmp/wheels
RUN python3 -m venv /opt/kvpilot \
 && /opt/kvpilot/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels "kvpilot[operator]" \
 && /opt/kvpilot/bin/pip uninstall --yes pip \
 && rm -rf /tmp/wheels \
 && echo "kvpilot:x:65532:65532:kvpilot:/tmp:/usr/sbin/nologin" >> /etc/passwd \
 && echo "kvpilot:x:65532:" >> /etc/group
ENV PATH=/opt/kvpilot/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["kvpilot"]
CMD ["operator", "--help"]
