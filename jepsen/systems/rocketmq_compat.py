"""Clients that any RocketMQ 4.x server accepts: the harness's way into clusters it did not build.

Our clients already send every header field RocketMQ 4.9's header classes require
(``@CFNotNull``), with its names: the producer sends SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE with
SendMessageRequestHeaderV2's one-letter names, pulls carry commitOffset and subVersion, and
topic creation carries CreateTopicRequestHeader's fields. Two habits remain that only a
ledgermq server is sure to take, and :func:`rocketmq_instance` turns them off:

- the ROCKETMQ binary header serialisation (cheaper for us; a Java client sends JSON unless
  told otherwise, so JSON is what every RocketMQ-protocol server has been tested with);
- the body CRC our clients add as an extra extField after the request hook ran: a broker that
  checks ACL signatures over all extFields would find one it was not signed with.
"""

from __future__ import annotations

from collections.abc import Sequence

from client.instance import ClientInstance
from remoting.config import RemotingConfig
from remoting.protocol import SERIALIZE_JSON


def rocketmq_instance(namesrv: str | Sequence[str], name: str) -> ClientInstance:
    """A client instance whose requests any RocketMQ 4.x nameserver and broker accept."""
    return ClientInstance(
        namesrv, remoting_config=RemotingConfig(serialize_type=SERIALIZE_JSON, send_crc=False), name=name
    )
