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
