"""The docker-compose group (docker-compose.yml at the top level) for tests and the harness.

``jepsen.docker.compose.ComposeGroup`` stands the group up, waits for health, reports
addresses and roles, and injects faults (kill, restart, pause, partitions) through Docker;
``jepsen.docker.images`` builds the image from a host-side wheelhouse. This package imports
nothing at import time so ``python -m jepsen.docker build`` works on a bare host Python.
"""
