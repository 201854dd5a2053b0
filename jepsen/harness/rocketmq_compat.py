"""Clients that any RocketMQ 4.x server accepts: the harness's way into clusters it did not build.

Our own clients speak RocketMQ's remoting, but lean on what ledgermq's broker forgives: the
binary header serialisation, a body CRC in an extra extField, and leaving out header fields
whose values are RocketMQ's defaults. Apache RocketMQ's broker decodes every request header
into a Java class whose ``@CFNotNull`` fields must be present (else it answers "the custom
field <x> is null"), and it reads ``SEND_BATCH_MESSAGE`` (320) with ``SEND_MESSAGE_V2``'s
one-letter header names. :func:`rocketmq_instance` builds a client instance that sends JSON
headers without our CRC field, and completes each request as RocketMQ 4.9's header classes
require (the values are RocketMQ's own defaults, so ledgermq reads them the same way).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from client.instance import ClientInstance
from remoting.codes import RequestCode
from remoting.config import RemotingConfig
from remoting.protocol import SERIALIZE_JSON, HeaderValue, RemotingCommand

DEFAULT_TOPIC = "TBW102"  # RocketMQ's template topic, named in every send and topic creation
DEFAULT_TOPIC_QUEUE_NUMS = 4

#: SendMessageRequestHeaderV2's one-letter names, as RocketMQ's broker decodes codes 310 and 320
V2_NAMES: dict[str, str] = {
    "producerGroup": "a",
    "topic": "b",
    "defaultTopic": "c",
    "defaultTopicQueueNums": "d",
    "queueId": "e",
    "sysFlag": "f",
    "bornTimestamp": "g",
    "flag": "h",
    "properties": "i",
    "reconsumeTimes": "j",
    "unitMode": "k",
    "maxReconsumeTimes": "l",
    "batch": "m",
    "brokerName": "n",
}

_SEND_DEFAULTS: dict[str, HeaderValue] = {
    "defaultTopic": DEFAULT_TOPIC,
    "defaultTopicQueueNums": DEFAULT_TOPIC_QUEUE_NUMS,
    "sysFlag": 0,
}
#: required fields our clients may leave out, by request code (SendMessageRequestHeader,
#: PullMessageRequestHeader, CreateTopicRequestHeader of RocketMQ 4.9)
REQUIRED_DEFAULTS: dict[int, dict[str, HeaderValue]] = {
    int(RequestCode.SEND_MESSAGE): _SEND_DEFAULTS,
    int(RequestCode.PULL_MESSAGE): {"commitOffset": 0, "subVersion": 0, "sysFlag": 0},
    int(RequestCode.UPDATE_AND_CREATE_TOPIC): {
        "defaultTopic": DEFAULT_TOPIC,
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": 0,
        "order": False,
    },
}
_V2_CODES = (int(RequestCode.SEND_BATCH_MESSAGE), int(RequestCode.SEND_MESSAGE_V2))


def complete_request(cmd: RemotingCommand) -> None:
    """Fill in what RocketMQ 4.x requires of ``cmd`` (in place; safe to run again on a retry)."""
    if cmd.code in _V2_CODES:
        headers = cmd.headers
        for name, value in _SEND_DEFAULTS.items():
            if name not in headers and V2_NAMES[name] not in headers:
                headers[name] = value
        # full names -> one letter; a full name present wins (a retry sets queueId afresh)
        for name, short in V2_NAMES.items():
            if name in headers:
                headers[short] = headers.pop(name)
        return
    defaults = REQUIRED_DEFAULTS.get(cmd.code)
    if defaults:
        for name, value in defaults.items():
            if name not in cmd.headers:
                cmd.headers[name] = value


def _chain(
    first: Callable[[RemotingCommand], None], then: Callable[[RemotingCommand], None] | None
) -> Callable[[RemotingCommand], None]:
    if then is None:
        return first

    def hook(cmd: RemotingCommand) -> None:
        first(cmd)
        then(cmd)  # the ACL signature covers the completed fields

    return hook


def rocketmq_instance(namesrv: str | Sequence[str], name: str) -> ClientInstance:
    """A client instance whose requests any RocketMQ 4.x nameserver and broker accept."""
    instance = ClientInstance(
        namesrv, remoting_config=RemotingConfig(serialize_type=SERIALIZE_JSON, send_crc=False), name=name
    )
    # before the first connection: each connection copies the hook when it is made
    instance.remoting.rpc_hook = _chain(complete_request, instance.remoting.rpc_hook)
    return instance
