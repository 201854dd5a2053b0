"""The master's records for due messages: the in-place path (every delivery) makes the
same message as decoding the held record, and hands records it does not read back."""

from __future__ import annotations

import pytest

from broker import derive
from remoting.message import (
    SYSFLAG_COMPRESSED,
    MessageFormatError,
    build_stored_record,
    decode_stored_messages,
    properties_to_bytes,
)

LEVELS = (1000, 5000, 10000)
NOW = 1_800_000_000_000
STORE_HOST = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f"
BORN_HOST = b"\x0a\x00\x00\x07\x00\x00\x30\x39"


def held_record(
    props: dict[str, str], *, body: bytes = b"payload", sys_flag: int = 0, reconsume: int = 0
) -> bytes:
    place = derive.schedule("Orders", 3, props, NOW - 2000, LEVELS, 86_400_000)
    assert place is not None
    return build_stored_record(
        place.topic.encode(),
        place.queue_id,
        body,
        properties_to_bytes(place.properties),
        7,
        sys_flag,
        NOW - 2000,
        BORN_HOST,
        NOW - 2000,
        STORE_HOST,
        reconsume,
    )


def slow(held: bytes) -> bytes:
    msg = derive.decode_held(held)
    place = derive.release(msg, NOW, LEVELS, 86_400_000)
    return derive.record(
        msg,
        place,
        sys_flag=msg.sys_flag,
        reconsume_times=msg.reconsume_times,
        store_ms=NOW,
        store_host=STORE_HOST,
    )


def fields(rec: bytes) -> tuple[object, ...]:
    (m,) = decode_stored_messages(rec, max_messages=1)
    return (
        m.topic,
        m.queue_id,
        m.body,
        m.flag,
        m.sys_flag,
        m.born_ms,
        m.born_host,
        m.store_ms,
        m.reconsume_times,
        m.all_properties(),
    )


@pytest.mark.parametrize(
    "props,reconsume",
    [
        ({"DELAY": "2", "UNIQ_KEY": "AC1100010000"}, 0),
        ({"TIMER_DELIVER_MS": str(NOW - 100), "TAGS": "red", "KEYS": "k1 k2"}, 0),
        ({"DELAY": "1", "RETRY_TOPIC": "Orders", "ORIGIN_MESSAGE_ID": "AC11", "x-user": "é ü"}, 3),
    ],
)
def test_the_in_place_release_makes_the_decoded_paths_record(props: dict[str, str], reconsume: int) -> None:
    held = held_record(props, reconsume=reconsume)
    fast = derive.released_record(held, NOW, LEVELS, 86_400_000, STORE_HOST, "test")
    assert fast is not None
    place, rec = fast
    assert (place.topic, place.queue_id) == ("Orders", 3)
    assert fields(rec) == fields(slow(held))
    assert "DELAY" not in fields(rec)[-1] and "TIMER_OUT_MS" not in fields(rec)[-1]


def test_a_compressed_held_body_is_left_to_the_decoding_path() -> None:
    import zlib

    held = held_record({"DELAY": "1"}, body=zlib.compress(b"x" * 100), sys_flag=SYSFLAG_COMPRESSED)
    assert derive.released_record(held, NOW, LEVELS, 86_400_000, STORE_HOST, "test") is None
    assert fields(slow(held))[2] == b"x" * 100


@pytest.mark.parametrize("cut", [3, 40, 95])
def test_a_truncated_held_record_is_refused_not_misread(cut: int) -> None:
    held = held_record({"DELAY": "1"})
    with pytest.raises(MessageFormatError):
        derive.released_record(held[:-cut], NOW, LEVELS, 86_400_000, STORE_HOST, "test")


def test_a_held_record_without_its_real_queue_is_a_placement_error() -> None:
    rec = build_stored_record(
        b"SCHEDULE_TOPIC_XXXX",
        0,
        b"b",
        properties_to_bytes({"TIMER_OUT_MS": "1"}),
        0,
        0,
        1,
        BORN_HOST,
        1,
        STORE_HOST,
    )
    with pytest.raises(derive.PlacementError, match="names no real topic"):
        derive.released_record(rec, NOW, LEVELS, 86_400_000, STORE_HOST, "at position 9")
