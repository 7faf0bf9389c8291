"""The change stream is trimmed behind the live mirror groups (plus a margin); an idle group stops holding it back."""

from __future__ import annotations

import time

import redis

from loopsq.state.keys import Keys
from loopsq.state.stream_trim import first_needed, mirror_groups, trim_stream

KEYS = Keys()
HOUR = 3_600_000


def fill(client: redis.Redis, n: int) -> list[str]:
    return [str(client.xadd(KEYS.changes, {"type": "t", "at": "", "data": "{}"})) for _ in range(n)]


def read(client: redis.Redis, group: str, count: int, ack: bool = True) -> list[str]:
    reply = client.xreadgroup(group, "c1", {KEYS.changes: ">"}, count=count)
    ids = [str(entry_id) for _, items in reply for entry_id, _ in items]
    if ack and ids:
        client.xack(KEYS.changes, group, *ids)
    return ids


def test_without_any_group_the_stream_keeps_only_the_margin(client: redis.Redis) -> None:
    ids = fill(client, 50)
    assert trim_stream(client, KEYS, HOUR, margin=10) == 40
    assert [str(i) for i, _ in client.xrange(KEYS.changes)] == ids[-10:]


def test_entries_a_live_group_has_not_acknowledged_stay_with_the_margin_before_them(client: redis.Redis) -> None:
    ids = fill(client, 60)
    client.xgroup_create(KEYS.changes, "mirror:a", id="0-0")
    read(client, "mirror:a", 30)  # acknowledged up to ids[29]
    read(client, "mirror:a", 10, ack=False)  # ids[30..39] delivered, not acknowledged
    groups = mirror_groups(client, KEYS, HOUR)
    assert [(g.name, g.pending, g.idle) for g in groups] == [("mirror:a", 10, False)]
    assert first_needed(client, KEYS, groups) == ids[30]
    trim_stream(client, KEYS, HOUR, margin=5)
    # Everything from the first unacknowledged entry, plus 5 before it.
    assert [str(i) for i, _ in client.xrange(KEYS.changes)] == ids[25:]


def test_the_slowest_live_group_holds_the_stream(client: redis.Redis) -> None:
    ids = fill(client, 40)
    for name in ("mirror:fast", "mirror:slow"):
        client.xgroup_create(KEYS.changes, name, id="0-0")
    read(client, "mirror:fast", 40)
    read(client, "mirror:slow", 10)
    assert first_needed(client, KEYS, mirror_groups(client, KEYS, HOUR)) == ids[9]
    trim_stream(client, KEYS, HOUR, margin=2)
    assert [str(i) for i, _ in client.xrange(KEYS.changes)] == ids[7:]


def test_a_group_idle_for_longer_than_the_limit_no_longer_holds_the_stream(client: redis.Redis) -> None:
    ids = fill(client, 40)
    client.xgroup_create(KEYS.changes, "mirror:gone", id="0-0")
    read(client, "mirror:gone", 5)
    time.sleep(0.05)
    groups = mirror_groups(client, KEYS, idle_ms=10)
    assert [(g.name, g.idle) for g in groups] == [("mirror:gone", True)]
    assert groups[0].idle_ms is not None and groups[0].idle_ms >= 10
    assert first_needed(client, KEYS, groups) is None
    trim_stream(client, KEYS, idle_ms=10, margin=3)
    assert [str(i) for i, _ in client.xrange(KEYS.changes)] == ids[-3:]
    # With a longer limit the same group is live again and holds the stream from where it read.
    assert not mirror_groups(client, KEYS, idle_ms=HOUR)[0].idle


def test_a_group_without_a_consumer_is_idle(client: redis.Redis) -> None:
    fill(client, 3)
    client.xgroup_create(KEYS.changes, "mirror:new", id="0-0")
    (group,) = mirror_groups(client, KEYS, HOUR)
    assert (group.consumers, group.idle_ms, group.idle) == (0, None, True)


def test_no_stream_yet_means_no_groups_and_nothing_to_trim(client: redis.Redis) -> None:
    assert mirror_groups(client, KEYS, HOUR) == []
    assert trim_stream(client, KEYS, HOUR) == 0


def test_a_live_group_that_has_read_nothing_keeps_the_whole_stream_without_an_error(client: redis.Redis) -> None:
    # A fresh deployment: the mirror made its group at 0-0 on a new stream and has read nothing since (its first
    # read, of its pending entries, made it a consumer). Redis 7.0 refuses 'XREVRANGE key (0-0 -'.
    client.xgroup_create(KEYS.changes, "mirror:new", id="0-0", mkstream=True)
    client.xreadgroup("mirror:new", "c1", {KEYS.changes: "0"}, count=1)
    (group,) = mirror_groups(client, KEYS, HOUR)
    assert (group.last_delivered, group.idle) == ("0-0", False)
    assert first_needed(client, KEYS, [group]) == "0-0"
    assert trim_stream(client, KEYS, HOUR, margin=2) == 0
    ids = fill(client, 5)  # the first changes are written: the group still needs them all
    assert trim_stream(client, KEYS, HOUR, margin=2) == 0
    assert [str(i) for i, _ in client.xrange(KEYS.changes)] == ids


def test_a_group_silent_for_seven_times_the_limit_is_removed_and_a_newer_silent_one_stays(client: redis.Redis) -> None:
    fill(client, 10)
    client.xgroup_create(KEYS.changes, "mirror:gone-for-good", id="0-0")
    read(client, "mirror:gone-for-good", 5)
    time.sleep(0.3)
    client.xgroup_create(KEYS.changes, "mirror:silent", id="0-0")
    read(client, "mirror:silent", 5)
    client.xgroup_create(KEYS.changes, "mirror:no-consumer", id="0-0")
    trim_stream(client, KEYS, idle_ms=30, margin=3)  # gone-for-good: silent > 210 ms; silent: < 210 ms
    assert [g.name for g in mirror_groups(client, KEYS, 30)] == ["mirror:no-consumer", "mirror:silent"]
