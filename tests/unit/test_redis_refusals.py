"""Redis errors that are not outages (``loopsq.state.outages``): refusals (``OOM``, ``READONLY``, ``BUSY``...) are
waited out and logged once in the server's own words, their end only once a write goes through; other errors
(``WRONGTYPE``, a script's error) are logged once per place and kind, with the count of those left out."""

from __future__ import annotations

import logging

import pytest
import redis

from loopsq.state.outages import ErrorLog, OutageLog, describe_refusal, is_transient, refusal

URL = "redis://:s3cret@10.0.0.9:6390/0"
PIPELINE_BUSY = ("Command # 1 (EVAL local t = redis.call('TIME') (x) /...) of pipeline caused error: BUSY Redis is "
                 "busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.")


@pytest.mark.parametrize(("exc", "transient", "refused", "words"), [
    (redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.", status_code="OOM"),
     True, "writes", "OOM command not allowed when used memory > 'maxmemory'."),
    (redis.exceptions.OutOfMemoryError("Command # 2 (SET k v) of pipeline caused error: command not allowed when "
                                       "used memory > 'maxmemory'."),
     True, "writes", "OOM command not allowed when used memory > 'maxmemory'."),
    (redis.exceptions.ReadOnlyError("You can't write against a read only replica.", status_code="READONLY"),
     True, "writes", "READONLY You can't write against a read only replica."),
    (redis.ResponseError(PIPELINE_BUSY), True, "commands",
     "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."),
    (redis.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist "
                         "to disk."), True, "writes", None),
    (redis.exceptions.MasterDownError("Link with MASTER is down", status_code="MASTERDOWN"), True, None, None),
    (redis.exceptions.TryAgainError("Multiple keys request during rehashing", status_code="TRYAGAIN"),
     True, "commands", None),
    (redis.ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed"), True, None,
     None),
    (redis.exceptions.NoScriptError("No matching script.", status_code="NOSCRIPT"), False, None, None),
    (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False, None, None),
    (redis.ResponseError("Error running script (call to f_x): @user_script:1: attempt to compare nil"), False,
     None, None),
])
def test_refusals_are_waited_out_and_named_in_the_servers_words(
    exc: Exception, transient: bool, refused: str | None, words: str | None
) -> None:
    assert (is_transient(exc), refusal(exc)) == (transient, refused)
    if words is not None:
        assert describe_refusal(exc) == words


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


OOM = redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'.", status_code="OOM")


def test_a_refusal_is_logged_once_as_such_and_ends_only_when_a_write_goes_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outage = OutageLog(URL, logging.getLogger("test.refusal"), clock=clock)
    caplog.set_level(logging.INFO, "test.refusal")
    for _ in range(5):
        outage.failed(OOM)
    assert outage.reason == "writes refused"
    outage.recovered(lambda: False)  # a read went through; a write would not
    clock.now += 1
    outage.recovered(lambda: False)
    assert outage.down
    clock.now += 1
    outage.recovered()  # a write went through
    assert [r.getMessage() for r in caplog.records] == [
        "Redis refuses writes: OOM command not allowed when used memory > 'maxmemory'. "
        "(redis://:***@10.0.0.9:6390/0); waiting (capped backoff)",
        "Redis accepts writes again after 2.0s",
    ]
    assert (outage.down, outage.reason) == (False, None)


def test_an_unblocked_read_starts_no_episode() -> None:
    outage = OutageLog(URL, logging.getLogger("test.unblocked"))
    outage.failed(redis.ResponseError("UNBLOCKED force unblock from blocking operation, instance state changed"))
    assert not outage.down


def test_an_error_that_is_not_an_outage_is_logged_once_per_place_and_kind_with_the_count_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    errors = ErrorLog(logging.getLogger("test.errors"), every_s=60, clock=clock)
    caplog.set_level(logging.INFO, "test.errors")
    wrongtype = redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    assert [errors.report("the scheduler loop", wrongtype) for _ in range(3)] == [True, False, False]
    assert errors.report("maintenance", wrongtype)
    assert errors.report("the scheduler loop", redis.ResponseError("ERR unknown command 'FOO'"))
    clock.now += 61
    assert errors.report("the scheduler loop", wrongtype)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == ("redis error in the scheduler loop, not an outage (a bug or corrupted data?); skipped, "
                           "going on: WRONGTYPE Operation against a key holding the wrong kind of value")
    assert messages[-1] == ("redis error in the scheduler loop, not an outage (a bug or corrupted data?); skipped, "
                            "going on (2 more like it since the last report): WRONGTYPE Operation against a key "
                            "holding the wrong kind of value")
    assert len(messages) == 4 and all(r.exc_info for r in caplog.records)
