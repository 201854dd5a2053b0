"""The cluster secret: one shared secret every node of a deployment proves to the others.

Ledger peers prove it on each connection (``ledger.auth``) and brokers sign their
registrations with the nameservers with it (``remoting.cluster_auth``), so a process that
can reach a port but does not hold the secret can neither join a group nor register routes.
It is given inline or, better, in a file readable by the server alone; this module loads it
the same way for every server so the rules and error messages agree.

Containers that share a volume agree on one secret with ``ensure_cluster_secret``, run before
each server as ``python -m common.cluster_secret ensure PATH -- SERVER ARGS...``: the value of
``LEDGERMQ_CLUSTER_SECRET`` when it is set, else the secret already in PATH, else a fresh one
that the first starter creates and every other adopts (docker-compose.yml does this, so
``docker-compose up`` needs no secret from its user).
"""

from __future__ import annotations

import os
import secrets
import sys
import tempfile
from pathlib import Path

from common.settings import ConfigError

MIN_SECRET_BYTES = 16  # shorter secrets are refused: they could be guessed offline from one proof
SECRET_ENV = "LEDGERMQ_CLUSTER_SECRET"  # the secret an operator gives ``ensure`` (else it makes one)


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


def _read_secret(path: Path) -> bytes | None:
    """The secret in ``path`` as the servers read it (trailing newline stripped), None if absent."""
    try:
        return path.read_bytes().rstrip(b"\r\n")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cluster secret file {path}: cannot read it: {exc.strerror}") from None


def _private_temp(folder: Path, secret: str) -> Path:
    """A new file in ``folder`` holding ``secret``, mode 0600 from the start, flushed to disk."""
    fd, name = tempfile.mkstemp(dir=folder, prefix=".cluster.secret.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secret + "\n")
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def ensure_cluster_secret(path: Path, value: str | None = None) -> str:
    """Make ``path`` hold the cluster secret; returns where it came from ("given", "kept", "created").

    ``value`` (e.g. ``LEDGERMQ_CLUSTER_SECRET``): written unless the file already holds it, by a
    rename, so a reader sees the old secret or the new one, never half of one. Without a value
    the file's own secret is kept, and a missing file gets a fresh random secret: written to a
    temporary file and linked into place, so that when several containers start at once the
    first link wins and the others, finding the name taken, adopt that one. The file is
    readable by its owner only from the moment it has a name. ConfigError names the file or
    the variable when a secret is shorter than MIN_SECRET_BYTES (the servers would refuse it).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if value:
        if len(value.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"{SECRET_ENV}: the cluster secret must be at least {MIN_SECRET_BYTES} bytes "
                "(e.g. openssl rand -hex 32)"
            )
        if _read_secret(path) == value.encode():
            return "given"
        tmp = _private_temp(path.parent, value)
        try:
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return "given"
    origin = "kept"
    if _read_secret(path) is None:
        tmp = _private_temp(path.parent, new_cluster_secret())
        try:
            os.link(tmp, path)
            origin = "created"
        except FileExistsError:
            pass  # another starter linked its secret first: adopt that one
        finally:
            tmp.unlink(missing_ok=True)
    held = _read_secret(path)
    if held is None or len(held) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"cluster secret file {path}: holds no secret of at least {MIN_SECRET_BYTES} bytes; "
            f"remove it (a fresh one is made) or set {SECRET_ENV}"
        )
    return origin


USAGE = f"""usage: python -m common.cluster_secret ensure PATH [-- COMMAND [ARGS...]]

Make PATH hold the cluster secret: ${SECRET_ENV} when set, else the secret already there,
else a fresh random one (created once, whoever else starts at the same time); then run
COMMAND in this process's place (a container's server keeps PID 1 and its signals)."""


def main(argv: list[str] | None = None) -> int:
    """``ensure PATH [-- COMMAND...]``; exit status 2 with one line on a usage or secret error."""
    args = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if "--" in args:
        cut = args.index("--")
        args, command = args[:cut], args[cut + 1 :]
    if len(args) != 2 or args[0] != "ensure" or command == []:
        print(USAGE, file=sys.stderr)
        return 2
    path = Path(args[1])
    try:
        origin = ensure_cluster_secret(path, os.environ.get(SECRET_ENV) or None)
    except (ConfigError, OSError) as exc:
        print(f"cluster secret: {exc}", file=sys.stderr)
        return 2
    print(f"cluster secret in {path} ({origin})", file=sys.stderr, flush=True)
    if command:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"cluster secret: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr)
            return 127
    return 0


if __name__ == "__main__":
    sys.exit(main())
