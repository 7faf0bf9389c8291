"""Tests of the bounded output capture: byte-exact tails, cumulative truncation counts, UTF-8 alignment."""

from __future__ import annotations

from loopsq.executor.output import DEFAULT_MAX_OUTPUT_BYTES, BoundedOutput


def capture(max_bytes: int, *chunks: bytes) -> BoundedOutput:
    out = BoundedOutput(max_bytes)
    for chunk in chunks:
        out.feed(chunk)
    return out


def test_default_limit_is_256_kib_per_stream() -> None:
    assert DEFAULT_MAX_OUTPUT_BYTES == 262_144
    assert BoundedOutput().max_bytes == 262_144


def test_output_within_the_limit_is_kept_whole_without_a_marker() -> None:
    assert capture(10, b"01234", b"56789").text() == "0123456789"


def test_empty_stream_gives_empty_text() -> None:
    assert capture(10).text() == ""
    assert capture(10, b"").text() == ""


def test_overflow_keeps_the_last_max_bytes_after_a_marker_counting_dropped_bytes() -> None:
    assert capture(10, b"0123456789abcdef").text() == "[truncated 6 bytes]\n6789abcdef"


def test_truncation_count_is_cumulative_over_every_chunk() -> None:
    out = capture(4, b"abcdef", b"ghij", b"kl", b"m")
    assert out.text() == "[truncated 9 bytes]\njklm"
    assert out.dropped == 9
    assert out.total == 13


def test_many_small_chunks_are_trimmed_exactly() -> None:
    out = capture(7, *[bytes([48 + i % 10]) for i in range(25)])
    assert out.text() == "[truncated 18 bytes]\n8901234"


def test_two_byte_character_cut_in_half_is_dropped_and_counted() -> None:
    # "é" is c3 a9; the cut leaves only a9 at the front of the tail.
    data = b"xxxx" + "é".encode() + b"123456789"
    assert capture(10, data).text() == "[truncated 6 bytes]\n123456789"


def test_three_byte_character_cut_after_its_first_byte_is_dropped_and_counted() -> None:
    data = b"ab" + "€".encode() + b"12345678"  # € is e2 82 ac; the tail starts at 82
    assert capture(10, data).text() == "[truncated 5 bytes]\n12345678"


def test_four_byte_character_cut_after_its_first_byte_is_dropped_and_counted() -> None:
    data = b"a" + "😀".encode() + b"1234567"  # f0 9f 98 80; the tail starts at 9f
    assert capture(10, data).text() == "[truncated 5 bytes]\n1234567"


def test_character_that_starts_exactly_at_the_cut_is_kept() -> None:
    data = b"abcdef" + "é".encode() + b"12345678"
    assert capture(10, data).text() == "[truncated 6 bytes]\né12345678"


def test_kept_tail_never_exceeds_max_bytes() -> None:
    out = capture(5, "ééééééé".encode())
    data, dropped = out.tail_bytes()
    assert len(data) <= 5
    assert dropped + len(data) == 14
    assert out.text() == "[truncated 10 bytes]\néé"


def test_invalid_utf8_is_decoded_with_replacement_characters() -> None:
    assert capture(10, b"ok\xff\xfe").text() == "ok\ufffd\ufffd"


def test_stray_continuation_bytes_are_dropped_at_most_three() -> None:
    # Not UTF-8 at all: only three bytes can belong to a cut character, the rest is shown replaced.
    out = capture(6, b"z" + b"\x80" * 6)
    assert out.text() == "[truncated 4 bytes]\n\ufffd\ufffd\ufffd"


def test_zero_limit_drops_everything() -> None:
    assert capture(0, b"abc").text() == "[truncated 3 bytes]\n"
