"""How user-chosen values are spelled inside Redis keys (``state.keys.key_part``): injective, short, free of the
key separator, hash-tag braces and glob characters, readable, and unchanged for plain values (so keys written
before the encoding keep their names)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loopsq.state.keys import (
    DIGEST_MARK,
    MAX_PART_LENGTH,
    PLAIN,
    Keys,
    has_old_spelling,
    key_part,
    spelled_as_before,
)

KEYS = Keys()
HUGE = "x" * 100_000

TRICKY = [
    "X", "X:fence", "X:queue", "X%3Afence", "X%3afence", "X%253Afence", "X:fence:fence", "X:", ":X", ":", "::",
    "*", "?", "[a]", "\\", "%2A", "{}", "{X}", "%7B%7D", "%", "%%", "%25", "|", "a|b", "", " ", "a b", "a\tb", "a\nb",
    "é", "e\u0301", "日本", "\U0001f600", "\udc80", "\x00", "\x7f", "repo:web", "repo/web", "-", "x" * 200, "x" * 201,
    "x" * 202, HUGE, HUGE + "y", "y" + HUGE, HUGE[:-1] + ":", "é" * 200, DIGEST_MARK, "a" + DIGEST_MARK + "0" * 64,
]

#: Every key a user-chosen value goes into, each as a function of that value.
FAMILIES: dict[str, Callable[[str], str]] = {
    "workspace": KEYS.workspace,
    "workspace_fence": KEYS.workspace_fence,
    "workspace_queue": KEYS.workspace_queue,
    "idempotency": lambda v: KEYS.idempotency("loop1", v),
    "wf_idempotency": lambda v: KEYS.wf_idempotency("wf1", v),
    "pool_holders": KEYS.pool_holders,
    "pool_waiters": KEYS.pool_waiters,
    "pool_seen": KEYS.pool_seen,
    "pool_fence": KEYS.pool_fence,
    "pool_lease": lambda v: KEYS.pool_lease(v, "holder1"),
    "host_runs": KEYS.host_runs,
    "live": lambda v: KEYS.live("run1", v),
}


def decode(part: str) -> str:
    """The value an uncut spelling stands for (percent-decoding)."""
    return unquote_to_bytes(part).decode("utf-8", "surrogatepass")


def test_the_keys_of_a_workspace_named_like_another_workspaces_keys_are_its_own() -> None:
    assert KEYS.workspace("X:fence") == "loopsq:workspace:X%3Afence"
    assert KEYS.workspace_fence("X") == "loopsq:workspace:X:fence"
    assert KEYS.workspace("X:queue") != KEYS.workspace_queue("X")
    assert KEYS.pool_holders("a:b") == "loopsq:pool:a%3Ab:holders"
    assert KEYS.idempotency("loop1", "{order}*") == "loopsq:idem:loop1:%7Border%7D%2A"


def test_tricky_values_get_distinct_spellings_and_no_two_values_share_a_key_in_any_family() -> None:
    spellings = [key_part(v) for v in TRICKY]
    assert len(set(spellings)) == len(TRICKY)
    every_key = [family(v) for family in FAMILIES.values() for v in TRICKY]
    seen: dict[str, tuple[str, str]] = {}
    for (name, family), value in itertools.product(FAMILIES.items(), TRICKY):
        key = family(value)
        assert key not in seen, (key, seen.get(key), (name, value))
        seen[key] = (name, value)
    assert len(seen) == len(every_key)


@pytest.mark.parametrize("value", TRICKY, ids=range(len(TRICKY)))
def test_a_spelling_is_short_ascii_and_free_of_separators_braces_globs_and_blanks(value: str) -> None:
    part = key_part(value)
    assert len(part) <= MAX_PART_LENGTH
    assert part.isascii() and part.isprintable()
    assert not re.search(r"[:{}*?\[\]\\| \t\n]", part), part


def test_a_100_kb_value_gives_a_short_key_with_a_readable_head_and_its_digest() -> None:
    key = KEYS.workspace(HUGE)
    assert len(key) <= len("loopsq:workspace:") + MAX_PART_LENGTH
    part = key_part(HUGE)
    head, digest = part.split(DIGEST_MARK)
    assert head == "x" * len(head) and len(head) > 100
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    # A cut never splits an escape.
    head = key_part("é" * 150).split(DIGEST_MARK)[0]
    assert head == "%C3%A9" * (len(head) // 6)


def test_plain_values_keep_the_spelling_older_versions_gave_them() -> None:
    for value in ("repo", "order-42", "gpu", "claude-acct", "a.b_c/d-e", "x" * MAX_PART_LENGTH, "Report#7~$"):
        assert key_part(value) == value and spelled_as_before(value)
        assert KEYS.workspace_fence(value) == KEYS.before_encoding.workspace_fence(value)
    for value in ("repo:web", "*", "{}", "a b", "é", "%", "x" * (MAX_PART_LENGTH + 1)):
        assert not spelled_as_before(value)
    assert KEYS.before_encoding.workspace_fence("a:b") == "loopsq:workspace:a:b:fence"  # the raw spelling


@given(st.text(max_size=300), st.text(max_size=300))
def test_different_values_never_share_a_spelling(a: str, b: str) -> None:
    if a != b:
        assert key_part(a) != key_part(b)


@given(st.text(max_size=MAX_PART_LENGTH))
def test_an_uncut_spelling_decodes_back_to_its_value(value: str) -> None:
    part = key_part(value)
    if DIGEST_MARK not in part:
        assert decode(part) == value
    assert len(part) <= MAX_PART_LENGTH


@given(st.text(alphabet=sorted(PLAIN), max_size=MAX_PART_LENGTH))
def test_every_plain_value_that_fits_is_spelled_as_it_is(value: str) -> None:
    assert key_part(value) == value


@given(st.text(min_size=MAX_PART_LENGTH + 1, max_size=5_000))
def test_a_long_value_is_cut_and_ends_in_the_digest_of_all_of_it(value: str) -> None:
    part = key_part(value)
    assert DIGEST_MARK in part and len(part) <= MAX_PART_LENGTH
    assert key_part(value[:-1] + ("a" if value[-1] != "a" else "b")) != part


def test_an_old_spelling_is_looked_at_only_where_no_value_is_spelled_that_way_now() -> None:
    assert has_old_spelling("X:fence") and has_old_spelling("{order}") and has_old_spelling("a b")
    assert has_old_spelling("50%off") and has_old_spelling("%3a")  # no escape key_part would write
    assert not has_old_spelling("repo")  # the same both ways
    assert not has_old_spelling("X%3Afence")  # its raw spelling is X:fence's now
    assert not has_old_spelling("a" + DIGEST_MARK + "0" * 64)  # it may be a cut spelling's


@given(st.text(max_size=300))
def test_no_values_spelling_now_is_another_values_old_spelling_that_gets_read(value: str) -> None:
    assert not has_old_spelling(key_part(value))
