"""The cluster secret: one shared secret every node of a deployment proves to the others.

Ledger peers prove it on each connection (``ledger.auth``) and brokers sign their
registrations with the nameservers with it (``remoting.cluster_auth``), so a process that
can reach a port but does not hold the secret can neither join a group nor register routes.
It is given inline or, better, in a file readable by the server alone; this module loads it
the same way for every server so the rules and error messages agree.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from common.settings import ConfigError

MIN_SECRET_BYTES = 16  # shorter secrets are refused: they could be guessed offline from one proof


def load_cluster_secret(value: str, file: str, key: str = "cluster_secret") -> bytes:
    """The secret from setting ``key`` or from the file named by ``{key}_file`` (a trailing
    newline stripped); empty when neither is set. ConfigError names the key or file."""
    if value and file:
        raise ConfigError(f"set either '{key}' or '{key}_file', not both")
    if file:
        path = Path(file)
        try:
            secret = path.read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise ConfigError(f"key '{key}_file': cannot read {path}: {exc.strerror}") from None
        where = f"key '{key}_file': {path}"
    else:
        secret = value.encode()
        where = f"key '{key}'"
    if secret and len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"{where}: the cluster secret must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def new_cluster_secret() -> str:
    """A fresh random secret (64 hex digits) for launchers that stand up a whole cluster."""
    return secrets.token_hex(32)


def write_cluster_secret(path: Path) -> Path:
    """A fresh secret in ``path``, readable by its owner only from the moment it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(new_cluster_secret() + "\n")
    return path
