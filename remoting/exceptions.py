"""Errors raised by the remoting layer.

They are split by what the caller can conclude: a connect error means the request never left
(safe to try another address), a timeout or a closed connection means it may or may not have
been processed (the Jepsen ``info`` case), and a command error means the peer answered and
said no. Producers and the Jepsen harness depend on this distinction.
"""

from __future__ import annotations


class RemotingError(Exception):
    """Base of every remoting error."""


class ProtocolError(RemotingError):
    """The byte stream cannot be decoded any further (bad magic, bad version): the connection is dropped."""


class FrameEncodeError(RemotingError, ValueError):
    """A command cannot be put on the wire (header map not JSON-serialisable or too large)."""


class RemotingConnectError(RemotingError):
    """No connection could be made to the address; the request was certainly not sent."""


class RemotingSendRequestError(RemotingError):
    """The connection failed before the request was written; the request was not sent."""


class RemotingTimeoutError(RemotingError, TimeoutError):
    """No response within the call's timeout; the peer may still have processed the request."""


class RemotingConnectionClosedError(RemotingError):
    """The connection closed while the request was in flight; outcome unknown."""


class RemotingFrameError(RemotingError):
    """The peer's response frame was refused (too large, CRC mismatch, bad header map)."""


class RemotingCommandError(RemotingError):
    """A request could not be processed as sent (missing or invalid header field, bad body).

    Raised by processors; the server turns it into a BAD_REQUEST response whose remark is the
    message, so the sender learns which field to fix.
    """


class ResponseError(RemotingError):
    """The peer answered with a non-success code; ``code`` and ``remark`` say what and why."""

    def __init__(self, code: int, remark: str, addr: str = "") -> None:
        from remoting.codes import response_code_name

        where = f" from {addr}" if addr else ""
        super().__init__(f"{response_code_name(code)} ({code}){where}: {remark}")
        self.code = code
        self.remark = remark
        self.addr = addr
