"""The request/response protocol shared by nameserver, brokers and clients (RocketMQ's remoting module).

Public API::

    from remoting import RemotingServer, RemotingClient, RemotingCommand, RequestCode, ResponseCode

    server = RemotingServer("127.0.0.1", 9876)
    server.register_processor(RequestCode.HEART_BEAT, lambda conn, req: req.make_response())
    await server.start()

    client = RemotingClient()
    resp = await client.invoke_sync("127.0.0.1:9876", RemotingCommand.request(RequestCode.HEART_BEAT), 3.0)
"""

from remoting.client import RemotingClient
from remoting.codes import RequestCode, ResponseCode, request_code_name, response_code_name
from remoting.config import RemotingConfig
from remoting.connection import RemotingConnection, RemotingStats, ResponseCallback
from remoting.dispatcher import Processor, RequestDispatcher
from remoting.exceptions import (
    FrameEncodeError,
    ProtocolError,
    RemotingCommandError,
    RemotingConnectError,
    RemotingConnectionClosedError,
    RemotingError,
    RemotingFrameError,
    RemotingSendRequestError,
    RemotingTimeoutError,
    ResponseError,
)
from remoting.protocol import BadFrame, FrameDecoder, RemotingCommand, encode_command, encode_parts
from remoting.server import RemotingServer

__all__ = [
    "BadFrame",
    "FrameDecoder",
    "FrameEncodeError",
    "Processor",
    "ProtocolError",
    "RemotingClient",
    "RemotingCommand",
    "RemotingCommandError",
    "RemotingConfig",
    "RemotingConnectError",
    "RemotingConnection",
    "RemotingConnectionClosedError",
    "RemotingError",
    "RemotingFrameError",
    "RemotingSendRequestError",
    "RemotingServer",
    "RemotingStats",
    "RemotingTimeoutError",
    "RequestCode",
    "RequestDispatcher",
    "ResponseCallback",
    "ResponseCode",
    "ResponseError",
    "encode_command",
    "encode_parts",
    "request_code_name",
    "response_code_name",
]
