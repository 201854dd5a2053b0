"""Header-map keys of the nameserver requests, spelled as RocketMQ spells them.

One place for both ends (broker registration and the nameserver's processor), so a typo
cannot make the two disagree silently.
"""

from __future__ import annotations

CLUSTER_NAME = "clusterName"
BROKER_NAME = "brokerName"
BROKER_ADDR = "brokerAddr"
BROKER_ID = "brokerId"
HA_SERVER_ADDR = "haServerAddr"
MASTER_ADDR = "masterAddr"
COMPRESSED = "compressed"
CHANGED = "changed"
TOPIC = "topic"
NAMESPACE = "namespace"
KEY = "key"
VALUE = "value"
WIPE_TOPIC_COUNT = "wipeTopicCount"
ADD_TOPIC_COUNT = "addTopicCount"

# SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) carry RocketMQ's SendMessageRequestHeaderV2:
# SendMessageRequestHeader's fields, each renamed to one letter (shorter headers, cheaper to parse).
# Full name -> short name, in the order a Java client's header lists them ("n" is 5.x's).
SEND_V2_NAMES = {
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
SEND_V2_FULL_NAMES = {short: full for full, short in SEND_V2_NAMES.items()}
