"""Tests for loopsq.domain.durations: the reference's parseDuration grammar and the CLI's compact format."""

from __future__ import annotations

import pytest

from loopsq.domain.durations import MAX_DURATION_MS, format_duration, parse_duration
from loopsq.errors import ValidationError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("250ms", 250),
        ("250", 250),
        ("30s", 30_000),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("0", 0),
        ("0s", 0),
    ],
)
def test_every_unit_multiplies_to_milliseconds(text: str, expected: int) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.5s", 1500),
        ("0.25h", 900_000),
        ("1.5ms", 2),
        ("2.5ms", 3),
        ("0.5", 1),
        ("0.0005s", 1),
        ("0.4ms", 0),
    ],
)
def test_decimals_round_half_up_like_javascript(text: str, expected: int) -> None:
    assert parse_duration(text) == expected


def test_surrounding_whitespace_is_trimmed() -> None:
    assert parse_duration("  10s\t\n") == 10_000


def test_one_hundred_years_is_the_largest_duration_accepted() -> None:
    assert parse_duration("36500d") == MAX_DURATION_MS
    with pytest.raises(ValidationError, match=r"^invalid duration: 36501d$"):
        parse_duration("36501d")


@pytest.mark.parametrize(
    "text", ["", " ", "-1s", "1h30m", "10x", "1e3", "1.s", ".5s", "s", "5 s", "٣s", "1S"]
)
def test_anything_outside_the_grammar_is_an_invalid_duration_quoting_the_input(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_duration(text)
    assert str(info.value) == f"invalid duration: {text}"


@pytest.mark.parametrize(
    ("ms", "expected"),
    [
        (0, "0ms"),
        (1, "1ms"),
        (1500, "1500ms"),
        (10_000, "10s"),
        (90_000, "90s"),
        (300_000, "5m"),
        (5_400_000, "90m"),
        (3_600_000, "1h"),
        (86_400_000, "1d"),
        (172_800_000, "2d"),
    ],
)
def test_format_uses_the_largest_unit_that_divides_exactly(ms: int, expected: str) -> None:
    assert format_duration(ms) == expected


@pytest.mark.parametrize("ms", [1, 999, 1500, 60_000, 86_400_000, 123_456_789])
def test_formatted_durations_parse_back_to_the_same_milliseconds(ms: int) -> None:
    assert parse_duration(format_duration(ms)) == ms
