"""Errors raised by producers, consumers and the admin tools.

The split that matters most is for sends. A caller recording a consistency history (the Jepsen
harness) must tell "this message was certainly not stored" from "it may or may not have been
stored", so the rule is simple:

- ``SendOutcomeUnknownError`` (``outcome_unknown`` is True): the message may have been stored
  (a timeout or a lost connection after the request went out, REPLICATION_TIMEOUT, SYSTEM_ERROR).
- every other exception from a send: the message was not stored by this call.

Every error says what happened in words a user can act on ("no nameserver address",
"no route info for topic X", "send failed after 3 tries to brokers [...]").
"""

from __future__ import annotations

from collections.abc import Sequence

from remoting.codes import response_code_name


class ClientError(Exception):
    """Base of every client error (RocketMQ's MQClientException)."""

    outcome_unknown: bool = False
    """True only when a write may have taken effect even though the call failed."""


class NoNameServerError(ClientError):
    """No nameserver address is configured (neither given nor in NAMESRV_ADDR)."""


class NameServerUnavailableError(ClientError):
    """No configured nameserver answered."""


class RouteNotFoundError(ClientError):
    """No nameserver knows a route for the topic (it does not exist or no live group serves it)."""

    def __init__(self, topic: str, detail: str = "") -> None:
        super().__init__(f"no route info for topic {topic}" + (f": {detail}" if detail else ""))
        self.topic = topic


class NoBrokerAvailableError(ClientError):
    """The route names no reachable broker for what was asked (e.g. a group without a master)."""


class MessageInvalidError(ClientError, ValueError):
    """The message cannot be sent as it is (bad topic, empty or oversize body); never retried."""


class BrokerError(ClientError):
    """A broker answered a non-send request with an error code; ``code`` and ``remark`` say why."""

    def __init__(self, code: int, remark: str, addr: str = "", what: str = "") -> None:
        where = f" from {addr}" if addr else ""
        prefix = f"{what}: " if what else ""
        super().__init__(f"{prefix}{response_code_name(code)} ({code}){where}: {remark}")
        self.code = code
        self.remark = remark
        self.addr = addr


class SendError(ClientError):
    """A send did not succeed. ``tries`` and ``brokers`` say where it went; ``code`` is the last
    broker response code (None when the last failure was not an answer from a broker)."""

    def __init__(
        self,
        message: str,
        *,
        topic: str = "",
        tries: int = 0,
        brokers: Sequence[str] = (),
        code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.tries = tries
        self.brokers = list(brokers)
        self.code = code


class SendFailedError(SendError):
    """The message was certainly not stored by this call (every attempt was refused or never sent)."""


class SendOutcomeUnknownError(SendError):
    """The message may or may not have been stored: Jepsen's ``info``.

    An idempotent producer can resend the same Message object (it keeps its producer id and
    sequence number), and the broker group stores it at most once.
    """

    outcome_unknown = True


class ClientStateError(ClientError):
    """The producer or consumer is not running (start() not called, or shut down)."""


__all__ = [
    "BrokerError",
    "ClientError",
    "MessageInvalidError",
    "NameServerUnavailableError",
    "NoBrokerAvailableError",
    "NoNameServerError",
    "ClientStateError",
    "RouteNotFoundError",
    "SendError",
    "SendFailedError",
    "SendOutcomeUnknownError",
]
