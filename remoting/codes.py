"""Request and response codes of RocketMQ's remoting protocol, which ledgermq speaks.

The numbers are RocketMQ's ``RequestCode`` and ``ResponseCode`` for every operation RocketMQ
has, so RocketMQ clients and tools work unchanged (a code we do not serve is answered
REQUEST_CODE_NOT_SUPPORTED, as RocketMQ's broker does). Codes that only ledgermq has live at 1000 and above, well clear of RocketMQ's
ranges, so a future RocketMQ code never collides with one of ours.
"""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    """What a request asks for. Unknown codes are answered with REQUEST_CODE_NOT_SUPPORTED."""

    # --- broker: messages -------------------------------------------------------------
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46

    # --- broker: RocketMQ 5's POP consumption (broker.pop) ------------------------------
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151

    # --- nameserver -------------------------------------------------------------------
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106

    # --- admin ------------------------------------------------------------------------
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    RESET_CONSUMER_CLIENT_OFFSET = 220
    GET_CONSUMER_STATUS_FROM_CLIENT = 221
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    GET_TOPICS_BY_CLUSTER = 224
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_CONSUMER_RUNNING_INFO = 307
    CONSUME_MESSAGE_DIRECTLY = 309
    SEND_MESSAGE_V2 = 310
    UPDATE_NAMESRV_CONFIG = 318
    GET_NAMESRV_CONFIG = 319
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322
    ADD_WRITE_PERM_OF_BROKER = 327
    GET_TOPIC_CONFIG = 351

    # --- ledgermq only ----------------------------------------------------------------
    GET_LEDGER_STATUS = 1000
    """Raft state of a broker group member (role, term, commit index); for admin tools and Jepsen."""
    GET_GROUP_MEMBERS = 1010
    """A broker group's members (voters, learners, their broker and ledger addresses, progress), from its master."""
    ADD_GROUP_MEMBER = 1011
    """Add a broker to the group as a learner (and promote it once caught up); proves the cluster secret."""
    PROMOTE_GROUP_MEMBER = 1012
    """Make a learner of the group a voter once it has caught up; proves the cluster secret."""
    REMOVE_GROUP_MEMBER = 1013
    """Remove a broker from the group; proves the cluster secret."""


class ResponseCode(IntEnum):
    """Outcome of a request. The remark of a response says why in words."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    INVALID_PARAMETER = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210

    # --- ledgermq only ----------------------------------------------------------------
    NOT_MASTER = 1001
    """The broker is not (or no longer) its group's master; header ``masterAddr`` may name the one to try."""
    FRAME_TOO_LARGE = 1002
    """The request's body or header map exceeded the receiver's limit; it was skipped unread."""
    BODY_CRC_MISMATCH = 1003
    """The body's CRC32 did not match the one the sender put in the frame: corrupted in transit."""
    BAD_REQUEST = 1004
    """The header map or body could not be decoded, or a required field is missing or invalid."""
    REPLICATION_TIMEOUT = 1005
    """The ledger did not commit the entry within the timeout; the outcome is unknown, not failed."""
    MEMBERSHIP_REFUSED = 1006
    """The group refused a membership change (the remark says why); header ``retryable`` is true when
    the same request may succeed shortly (another change in progress, a learner still catching up)."""


POP_REQUEST_NAMES = {
    200052: "PEEK_MESSAGE",
    200054: "NOTIFICATION",
    200055: "POLLING_INFO",
}
"""RocketMQ 5's POP codes ledgermq brokers do not serve (yet), refused by name."""

_REQUEST_NAMES = {c.value: c.name for c in RequestCode} | POP_REQUEST_NAMES
_RESPONSE_NAMES = {c.value: c.name for c in ResponseCode}


def request_code_name(code: int) -> str:
    """Name for logs and metrics; an unknown number is shown as such rather than raising."""
    return _REQUEST_NAMES.get(code, f"UNKNOWN({code})")


def response_code_name(code: int) -> str:
    """Name for logs and error messages; an unknown number is shown as such rather than raising."""
    return _RESPONSE_NAMES.get(code, f"UNKNOWN({code})")
