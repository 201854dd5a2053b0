# ledgermq: nameserver, broker and ledger in one image (the command picks the server).
#
# Build it with `jepsen/docker/build-image.sh`, which first makes wheelhouse/ on the host
# (the project wheel plus the servers' run-time dependency wheels), so nothing here needs the
# network. Elsewhere the usual base works:
#     docker build -t ledgermq:latest .                       # FROM python:3.11-slim
# Where no registry is reachable, jepsen/docker/build-base-image.sh makes a local Debian base:
#     docker build --build-arg BASE_IMAGE=ledgermq-base:bookworm -t ledgermq:latest .
# Works with the classic builder (no BuildKit-only syntax).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# iptables + iproute2 for partition tests (containers run with cap NET_ADMIN). The local
# debootstrap base already has them; python:3.11-slim gets them from apt.
RUN if ! command -v iptables >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then \
        apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables iproute2 \
        && rm -rf /var/lib/apt/lists/*; \
    fi

# Run-time dependencies first: this layer stays cached while only the project changes.
COPY wheelhouse/deps/ /wheelhouse/deps/
RUN python3 -m venv /opt/ledgermq \
    && /opt/ledgermq/bin/pip install --no-index --no-cache-dir --disable-pip-version-check \
        --find-links /wheelhouse/deps xxhash zlib-ng uvloop prometheus-client click grpcio protobuf \
    && rm -rf /wheelhouse/deps

# The project itself, without its harness/checker dependencies (pyspark, matplotlib, ...).
COPY wheelhouse/ledgermq-*.whl /wheelhouse/
RUN /opt/ledgermq/bin/pip install --no-index --no-cache-dir --disable-pip-version-check --no-deps \
        /wheelhouse/ledgermq-*.whl \
    && rm -rf /wheelhouse \
    && /opt/ledgermq/bin/python -c "import broker.cli, namesrv.cli, ledger.node, uvloop, xxhash, zlib_ng, proxy.server, proxy.protocol"

ENV PATH=/opt/ledgermq/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /var/lib/ledgermq
# Ports are set per container (docker-compose.yml publishes what clients need): nameserver
# 9876; brokers' main ports 10911/10921/10931, fast port = main - 2, ledger 20911/20921/20931.
CMD ["namesrv", "--listen-host", "0.0.0.0"]
