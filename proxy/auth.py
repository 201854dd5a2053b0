"""RocketMQ 5's authentication, checked against ledgermq's ACL accounts (``remoting.acl``).

A 5.x client with credentials sends, with every RPC, the metadata ``x-mq-date-time`` (its
clock, ``%Y%m%dT%H%M%SZ``) and ``authorization: MQv2-HMAC-SHA1 Credential=<access key>,
SignedHeaders=x-mq-date-time, Signature=<hex HmacSHA1(secret key, date-time)>``. The proxy
finds the account by its access key, recomputes the signature with its secret, and then holds
the request to the same permissions the brokers hold a 4.x client to (topics PUB/SUB, groups
SUB). The proxy itself talks to the brokers with its own (admin) keys.

Without accounts every request is taken, as brokers without ACL take them.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from remoting.acl import PUB, SUB, Account

SCHEME = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
MAX_AUTH_CHARS = 1024

__all__ = ["PUB", "SUB", "AuthError", "Authenticator"]


class AuthError(Exception):
    """Refused: ``code`` is UNAUTHORIZED (who are you) or FORBIDDEN (not allowed)."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code


def parse_authorization(value: str) -> tuple[str, str, str]:
    """(access key, signed headers, signature) of an ``authorization`` value; AuthError if malformed."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME or len(value) > MAX_AUTH_CHARS:
        raise AuthError("UNAUTHORIZED", f"authorization must use {SCHEME}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            fields[key.strip()] = val.strip()
    try:
        return fields["Credential"], fields["SignedHeaders"], fields["Signature"]
    except KeyError as exc:
        raise AuthError("UNAUTHORIZED", f"authorization lacks {exc.args[0]}") from None


def sign(secret_key: str, date_time: str) -> str:
    """The 5.x clients' signature: hex HmacSHA1 of the date-time header under the secret key."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


class Authenticator:
    """Checks each RPC's metadata against ``accounts`` (None: no ACL, everything is taken)."""

    def __init__(self, accounts: Mapping[str, Account] | None = None) -> None:
        self.accounts = dict(accounts) if accounts else None

    @property
    def enabled(self) -> bool:
        return self.accounts is not None

    def check(self, metadata: Sequence[Any] | None) -> Account | None:
        """The caller's account (None without ACL); AuthError UNAUTHORIZED when it proves none."""
        if self.accounts is None:
            return None
        md = {str(k).lower(): v for k, v in (metadata or ())}
        value = md.get("authorization")
        date_time = md.get(DATE_HEADER)
        if not isinstance(value, str) or not isinstance(date_time, str):
            raise AuthError("UNAUTHORIZED", "credentials required: the proxy's ACL is on")
        access_key, signed, signature = parse_authorization(value)
        if signed.lower() != DATE_HEADER:
            raise AuthError("UNAUTHORIZED", f"SignedHeaders must be {DATE_HEADER}")
        account = self.accounts.get(access_key)
        if account is None:
            raise AuthError("UNAUTHORIZED", f"access key {access_key[:60]!r} is unknown")
        if not hmac.compare_digest(sign(account.secret_key, date_time), signature.lower()):
            raise AuthError("UNAUTHORIZED", f"signature of access key {access_key!r} does not match")
        return account

    @staticmethod
    def allow_topic(account: Account | None, topic: str, perm: int) -> None:
        if account is not None and not account.admin and not account.topic_perm(topic) & perm:
            what = "PUB" if perm == PUB else "SUB"
            raise AuthError(
                "FORBIDDEN", f"access key {account.access_key!r} has no {what} on topic {topic!r}"
            )

    @staticmethod
    def allow_group(account: Account | None, group: str) -> None:
        if account is not None and not account.admin and not account.group_perm(group) & SUB:
            raise AuthError("FORBIDDEN", f"access key {account.access_key!r} has no SUB on group {group!r}")
