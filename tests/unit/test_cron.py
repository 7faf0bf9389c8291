"""Tests for loopsq.domain.cron: standard syntax through croniter, exact errors, zones and the DST rule."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from loopsq.domain.cron import (
    MACROS,
    host_timezone_name,
    load_zone,
    next_cron_run,
    prev_cron_run,
    validate_cron,
    validate_timezone,
)
from loopsq.domain.timeutil import from_iso, to_iso
from loopsq.errors import ValidationError

NEW_YORK = "America/New_York"
BERLIN = "Europe/Berlin"


def runs(expression: str, after: str, count: int, tz: str = "UTC") -> list[str]:
    """The next ``count`` runs after ``after``, as ISO strings."""
    found, cursor = [], from_iso(after)
    for _ in range(count):
        cursor = next_cron_run(expression, cursor, tz)
        found.append(to_iso(cursor))
    return found


def error_of(expression: str) -> str:
    with pytest.raises(ValidationError) as info:
        validate_cron(expression)
    return str(info.value)


def test_five_slash_fifteen_means_every_fifteen_minutes_from_five() -> None:
    assert runs("5/15 * * * *", "2026-01-01T00:00:00.000Z", 5) == [
        "2026-01-01T00:05:00.000Z",
        "2026-01-01T00:20:00.000Z",
        "2026-01-01T00:35:00.000Z",
        "2026-01-01T00:50:00.000Z",
        "2026-01-01T01:05:00.000Z",
    ]


def test_validation_returns_the_expression_stripped_with_whitespace_collapsed() -> None:
    assert validate_cron("  */5 \t 9-17  *   * MON-FRI \n") == "*/5 9-17 * * MON-FRI"


def test_month_and_weekday_names_are_accepted_in_any_case() -> None:
    # 2026-01-01 is a Thursday; the first Monday of a January or March after it is 2026-01-05.
    assert runs("0 9 * JAN,mar Mon", "2026-01-01T00:00:00.000Z", 2) == [
        "2026-01-05T09:00:00.000Z",
        "2026-01-12T09:00:00.000Z",
    ]
    assert runs("0 9 * * mon-fri", "2026-01-02T10:00:00.000Z", 2) == [
        "2026-01-05T09:00:00.000Z",
        "2026-01-06T09:00:00.000Z",
    ]


@pytest.mark.parametrize(("macro", "equivalent"), sorted(MACROS.items()))
def test_every_macro_runs_as_its_five_field_form(macro: str, equivalent: str) -> None:
    assert validate_cron(macro) == macro
    after = "2026-05-17T13:45:00.000Z"
    assert runs(macro, after, 3, BERLIN) == runs(equivalent, after, 3, BERLIN)


def test_macros_map_to_the_standard_schedules() -> None:
    assert MACROS == {
        "@yearly": "0 0 1 1 *",
        "@annually": "0 0 1 1 *",
        "@monthly": "0 0 1 * *",
        "@weekly": "0 0 * * 0",
        "@daily": "0 0 * * *",
        "@midnight": "0 0 * * *",
        "@hourly": "0 * * * *",
    }


def test_an_equal_range_means_that_one_value_not_the_whole_cycle() -> None:
    assert runs("5-5 * * * *", "2026-01-01T00:00:00.000Z", 2) == [
        "2026-01-01T00:05:00.000Z",
        "2026-01-01T01:05:00.000Z",
    ]
    # 2026-01-04 is a Sunday.
    assert runs("0 0 * * SUN-SUN", "2026-01-01T00:00:00.000Z", 2) == [
        "2026-01-04T00:00:00.000Z",
        "2026-01-11T00:00:00.000Z",
    ]


def test_seven_is_sunday_in_the_weekday_field_including_steps_that_reach_it() -> None:
    assert runs("0 0 * * 7", "2026-01-01T00:00:00.000Z", 1) == ["2026-01-04T00:00:00.000Z"]
    # 5/2 is 5,7: Friday and Sunday.
    assert runs("0 0 * * 5/2", "2026-01-01T00:00:00.000Z", 3) == [
        "2026-01-02T00:00:00.000Z",
        "2026-01-04T00:00:00.000Z",
        "2026-01-09T00:00:00.000Z",
    ]


def test_leap_day_is_a_valid_expression_that_waits_for_a_leap_year() -> None:
    assert runs("0 0 29 2 *", "2026-01-01T00:00:00.000Z", 1) == ["2028-02-29T00:00:00.000Z"]


def test_both_day_fields_restricted_match_either_day() -> None:
    # The 31st of February never comes, but Mondays in February do.
    assert runs("0 0 31 2 MON", "2026-01-01T00:00:00.000Z", 1) == ["2026-02-02T00:00:00.000Z"]


@pytest.mark.parametrize(
    ("expression", "count"),
    [("", 0), ("* * * *", 4), ("* * * * * *", 6), ("0 0 * * * * 2026", 7), ("@daily 5", 2)],
)
def test_a_wrong_number_of_fields_is_reported_with_the_count(expression: str, count: int) -> None:
    assert error_of(expression) == f'cron must have 5 fields, got {count}: "{expression}"'


@pytest.mark.parametrize(
    "expression",
    [
        "H * * * *",
        "H(0-29) * * * *",
        "R * * * *",
        "0 0 L * *",
        "0 0 15W * *",
        "0 0 * * 5L",
        "0 0 * * MON#2",
        "0 0 ? * MON",
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * * 13 *",
        "* * * * 8",
        "*/0 * * * *",
        "5-5/0 * * * *",
        "*-5 * * * *",
        "50-10 * * * *",
        "0 0 * * SAT-SUN",
        "JAN * * * *",
        "0 0 * * MONDAY",
        "0 0 * FOO *",
        "1,,2 * * * *",
        "-1 * * * *",
        "1.5 * * * *",
        "%d * * * *",
        "1234567 * * * *",
    ],
)
def test_extensions_and_bad_values_are_invalid_cron_expressions(expression: str) -> None:
    assert error_of(expression) == f'invalid cron expression: "{expression}"'


@pytest.mark.parametrize("expression", ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 30-31 2 *"])
def test_an_expression_that_never_matches_is_rejected(expression: str) -> None:
    assert error_of(expression) == f'cron expression never matches: "{expression}"'


def test_error_messages_quote_the_normalised_expression() -> None:
    assert error_of("  0  0 31 2 * ") == 'cron expression never matches: "0 0 31 2 *"'


def test_the_next_run_is_strictly_after_a_time_that_is_itself_a_match() -> None:
    assert runs("0 * * * *", "2026-01-01T12:00:00.000Z", 1) == ["2026-01-01T13:00:00.000Z"]
    assert runs("0 * * * *", "2026-01-01T11:59:59.999Z", 1) == ["2026-01-01T12:00:00.000Z"]


def test_the_result_is_aware_utc_with_millisecond_precision() -> None:
    result = next_cron_run("* * * * *", datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC), BERLIN)
    assert result == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert result.tzinfo is UTC


def test_the_expression_is_read_in_the_given_zone() -> None:
    # 09:00 in New York in January is 14:00 UTC; in Berlin it is 08:00 UTC.
    assert runs("0 9 * * *", "2026-01-10T00:00:00.000Z", 1, NEW_YORK) == ["2026-01-10T14:00:00.000Z"]
    assert runs("0 9 * * *", "2026-01-10T00:00:00.000Z", 1, BERLIN) == ["2026-01-10T08:00:00.000Z"]


def test_a_local_time_in_the_spring_forward_gap_is_skipped_that_day() -> None:
    # New York skips 02:00-02:59 on 2026-03-08; 02:30 runs next on 03-09 (EDT, UTC-4).
    assert runs("30 2 * * *", "2026-03-07T12:00:00.000Z", 2, NEW_YORK) == [
        "2026-03-09T06:30:00.000Z",
        "2026-03-10T06:30:00.000Z",
    ]
    # An hourly loop goes straight from 01:00 EST to 03:00 EDT.
    assert runs("0 * * * *", "2026-03-08T05:30:00.000Z", 2, NEW_YORK) == [
        "2026-03-08T06:00:00.000Z",
        "2026-03-08T07:00:00.000Z",
    ]


def test_a_repeated_local_time_runs_once_at_its_first_occurrence() -> None:
    # New York repeats 01:00-01:59 on 2026-11-01: first as EDT (05:xxZ), then as EST (06:xxZ).
    assert runs("30 1 * * *", "2026-11-01T04:00:00.000Z", 2, NEW_YORK) == [
        "2026-11-01T05:30:00.000Z",
        "2026-11-02T06:30:00.000Z",
    ]
    assert runs("*/30 * * * *", "2026-11-01T04:45:00.000Z", 4, NEW_YORK) == [
        "2026-11-01T05:00:00.000Z",
        "2026-11-01T05:30:00.000Z",
        "2026-11-01T07:00:00.000Z",
        "2026-11-01T07:30:00.000Z",
    ]


def test_a_start_inside_the_second_pass_of_the_repeated_hour_does_not_rerun_it() -> None:
    # 06:10Z is 01:10 EST, the second 01:10 of the night; 01:30 already ran at 05:30Z.
    assert runs("*/30 * * * *", "2026-11-01T06:10:00.000Z", 1, NEW_YORK) == ["2026-11-01T07:00:00.000Z"]
    assert runs("30 1 * * *", "2026-11-01T06:10:00.000Z", 1, NEW_YORK) == ["2026-11-02T06:30:00.000Z"]
    assert runs("0 2 * * *", "2026-11-01T06:10:00.000Z", 1, NEW_YORK) == ["2026-11-01T07:00:00.000Z"]


def test_berlin_skips_the_gap_and_runs_the_repeated_hour_once() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST. 2026-10-25: 03:00 CEST falls back to 02:00 CET.
    assert runs("30 2 * * *", "2026-03-28T00:00:00.000Z", 2, BERLIN) == [
        "2026-03-28T01:30:00.000Z",
        "2026-03-30T00:30:00.000Z",
    ]
    assert runs("30 2 * * *", "2026-10-24T12:00:00.000Z", 2, BERLIN) == [
        "2026-10-25T00:30:00.000Z",
        "2026-10-26T01:30:00.000Z",
    ]


@pytest.mark.parametrize(
    ("expression", "at", "tz", "expected"),
    [
        ("0 * * * *", "2026-01-01T12:00:00.000Z", "UTC", "2026-01-01T12:00:00.000Z"),
        ("0 * * * *", "2026-01-01T12:59:59.999Z", "UTC", "2026-01-01T12:00:00.000Z"),
        ("30 2 * * *", "2026-03-09T06:29:00.000Z", NEW_YORK, "2026-03-07T07:30:00.000Z"),
        ("*/30 * * * *", "2026-11-01T06:10:00.000Z", NEW_YORK, "2026-11-01T05:30:00.000Z"),
        ("*/30 * * * *", "2026-11-01T06:59:00.000Z", NEW_YORK, "2026-11-01T05:30:00.000Z"),
        ("*/30 * * * *", "2026-11-01T07:00:00.000Z", NEW_YORK, "2026-11-01T07:00:00.000Z"),
    ],
)
def test_the_previous_run_is_the_latest_match_at_or_before_a_time(
    expression: str, at: str, tz: str, expected: str
) -> None:
    result = prev_cron_run(expression, from_iso(at), tz)
    assert result is not None
    assert to_iso(result) == expected


def test_an_unknown_zone_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match=r"^unknown timezone: Mars/Olympus$"):
        next_cron_run("* * * * *", datetime(2026, 1, 1, tzinfo=UTC), "Mars/Olympus")


@pytest.mark.parametrize(
    "name",
    ["", "Mars/Olympus", "/etc/passwd", "../zoneinfo/UTC", "America/", "America", "UTC\x00", "a" * 5000],
)
def test_names_zoneinfo_cannot_load_are_unknown_timezones(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_timezone(name)
    assert str(info.value) == f"unknown timezone: {name}"


def test_valid_zone_names_are_returned_unchanged_and_loadable() -> None:
    assert validate_timezone("Europe/Berlin") == "Europe/Berlin"
    assert load_zone("UTC").key == "UTC"


def test_the_host_zone_comes_from_tz_when_it_names_a_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert host_timezone_name() == "Asia/Tokyo"
    monkeypatch.setenv("TZ", ":Europe/Berlin")
    assert host_timezone_name() == "Europe/Berlin"


def test_the_host_zone_falls_back_to_the_localtime_link_then_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "not a zone")
    monkeypatch.setattr("os.path.realpath", lambda path: "/usr/share/zoneinfo/posix/America/Chicago")
    assert host_timezone_name() == "America/Chicago"
    monkeypatch.setattr("os.path.realpath", lambda path: "/etc/localtime")
    assert host_timezone_name() == "UTC"
    monkeypatch.delenv("TZ")
    monkeypatch.setattr("os.path.realpath", lambda path: "/usr/share/zoneinfo/Nowhere/Land")
    assert host_timezone_name() == "UTC"


def test_reboot_has_its_own_error() -> None:
    assert error_of("@reboot") == "@reboot is not supported"
    assert error_of("  @REBOOT ") == "@reboot is not supported"


def test_an_unknown_macro_names_itself_and_the_known_ones() -> None:
    assert error_of("@fortnightly") == (
        'unknown cron macro: "@fortnightly" (use one of @yearly @annually @monthly @weekly @daily @midnight @hourly)')


def test_a_huge_expression_is_quoted_by_a_short_escaped_prefix() -> None:
    message = error_of("1 " * 500_000)
    assert message.startswith('cron must have 5 fields, got 500000: "1 1 1 ')
    assert message.endswith('… (999935 more characters)"') and len(message) < 200


# The day rule (README "Cron day rule"): each example is (expression, the first six days after Sun 2026-02-01).
DAY_RULE = [
    ("0 0 15 * *", ["Sun 15", "Sun 15", "Wed 15", "Fri 15", "Mon 15", "Wed 15"]),  # day-of-month alone
    ("0 0 * * MON", ["Mon 02", "Mon 09", "Mon 16", "Mon 23", "Mon 02", "Mon 09"]),  # day-of-week alone
    ("0 0 1,15 * MON", ["Mon 02", "Mon 09", "Sun 15", "Mon 16", "Mon 23", "Sun 01"]),  # both: either matches
    ("0 0 */2 * MON", ["Mon 02", "Tue 03", "Thu 05", "Sat 07", "Mon 09", "Wed 11"]),  # */2 restricts: OR
    ("0 0 1-31 * MON", ["Mon 02", "Tue 03", "Wed 04", "Thu 05", "Fri 06", "Sat 07"]),  # 1-31 restricts: OR
    ("0 0 15 * *,MON", ["Sun 15", "Sun 15", "Wed 15", "Fri 15", "Mon 15", "Wed 15"]),  # a bare * part: AND
    ("0 0 *,15 * MON", ["Mon 02", "Mon 09", "Mon 16", "Mon 23", "Mon 02", "Mon 09"]),  # a bare * part: AND
]


@pytest.mark.parametrize(("expression", "days"), DAY_RULE)
def test_the_documented_day_rule_holds(expression: str, days: list[str]) -> None:
    from datetime import UTC, datetime

    from loopsq.domain.cron import next_cron_run

    at, out = datetime(2026, 2, 1, tzinfo=UTC), []
    for _ in range(6):
        at = next_cron_run(expression, at, "UTC")
        out.append(at.strftime("%a %d"))
    assert out == days


def test_the_readme_states_the_day_rule_with_its_examples() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for expression, _ in DAY_RULE:
        assert f"`{expression}`" in readme, expression
