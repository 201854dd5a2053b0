"""Header-map keys of the nameserver requests, spelled as RocketMQ spells them.

One place for both ends (broker registration and the nameserver's processor), so a typo
cannot make the two disagree silently.
"""

from __future__ import annotations

from collections.abc import Mapping

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

# Which header layout a send uses, decided in one place: the ACL checks the topic this says
# and the broker stores into the same one, so no mix of names can pass one and hit another.
_SEND_V2_CODES = frozenset((310, 320))  # SEND_MESSAGE_V2, SEND_BATCH_MESSAGE
_SEND_CODES = frozenset((10, 310, 320))


def uses_send_v2_names(code: int, headers: Mapping[str, object]) -> bool:
    """Whether a send request's fields are read under their one-letter names: for the V2 codes
    when ``b`` (the topic) is there (RocketMQ's clients), for SEND_MESSAGE only when ``topic``
    is not (some 4.x clients send V2 headers with code 10)."""
    if code in _SEND_V2_CODES:
        return SEND_V2_NAMES[TOPIC] in headers
    return code in _SEND_CODES and TOPIC not in headers


def spelled_out_send_headers(code: int, headers: Mapping[str, object]) -> dict[str, object]:
    """A send request's headers under their full names. Under the V2 layout the full names of
    send fields are ignored (the short ones say what they are); other headers pass through."""
    return v2_spelled_out(headers) if uses_send_v2_names(code, headers) else dict(headers)


_DROPPED = "\x00"  # where the full names of send fields go in a V2 request (then removed)
# short name -> full name, and full name -> _DROPPED: one lookup per header
_V2_RENAME: dict[str, str] = {**{full: _DROPPED for full in SEND_V2_NAMES}, **SEND_V2_FULL_NAMES}


def v2_spelled_out(headers: Mapping[str, object]) -> dict[str, object]:
    """V2 send headers under their full names (the full names of send fields, if a request
    also carries them, are dropped: the short ones say what they are). On the path of every
    V2 send: one dictionary lookup per header."""
    get = _V2_RENAME.get
    out = {get(k, k): v for k, v in headers.items()}
    out.pop(_DROPPED, None)
    return out


def send_topic(code: int, headers: Mapping[str, object]) -> object:
    """The topic a send request addresses (None if it names none)."""
    return headers.get(SEND_V2_NAMES[TOPIC] if uses_send_v2_names(code, headers) else TOPIC)
