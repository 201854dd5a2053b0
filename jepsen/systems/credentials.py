"""The ACL account the harness's clients sign with, and how it reaches worker processes.

A backend whose brokers run with ACL on (the docker group: docker-compose.yml turns it on)
hands its clients an access key and a secret key. Worker processes get their clients from a
JSON spec written into the run folder; the secret stays out of that spec: the backend writes
it once to a file only its owner can read, and the spec names the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

CREDENTIALS_FILE = "acl.credentials"
MAX_CREDENTIALS_BYTES = 4096  # a credentials file is two short strings; refuse anything bigger


@dataclass(frozen=True)
class Credentials:
    """An ACL account (RocketMQ's AccessKey/SecretKey); the secret is kept out of reprs."""

    access_key: str
    secret_key: str = field(repr=False)

    def write(self, base_dir: Path) -> Path:
        """Write to ``base_dir/acl.credentials``, readable by its owner only; returns the path."""
        base_dir.mkdir(parents=True, exist_ok=True)
        path = base_dir / CREDENTIALS_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"access_key": self.access_key, "secret_key": self.secret_key}, f)
        return path

    @classmethod
    def read(cls, path: str | Path) -> Credentials:
        """The account in ``path``; a ValueError naming the file if it is not one."""
        p = Path(path)
        try:
            raw = p.read_bytes()[: MAX_CREDENTIALS_BYTES + 1]
        except OSError as exc:
            raise ValueError(f"cannot read ACL credentials {p}: {exc.strerror or exc}") from None
        if len(raw) > MAX_CREDENTIALS_BYTES:
            raise ValueError(f"ACL credentials {p}: larger than {MAX_CREDENTIALS_BYTES} bytes")
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"ACL credentials {p}: not JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"ACL credentials {p}: expected an object with access_key and secret_key")
        ak, sk = doc.get("access_key"), doc.get("secret_key")
        if not (isinstance(ak, str) and ak and isinstance(sk, str) and sk):
            raise ValueError(f"ACL credentials {p}: access_key and secret_key must be non-empty strings")
        return cls(ak, sk)
