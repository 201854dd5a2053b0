#!/usr/bin/env bash
# Build the ledgermq image: base image (python:3.11-slim, or a local debootstrap base where no
# registry is reachable), wheelhouse/ on the host, then `docker build` with the classic builder.
# Usage: jepsen/docker/build-image.sh [--tag ledgermq:latest] [--base-image IMAGE] [--refresh-deps]
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" -m jepsen.docker build "$@"
