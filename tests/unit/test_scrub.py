"""Secret scrubbing (``domain.scrub``, OpenLoops 0.4.0: stored output leaked keys): each secret shape is replaced by
``[SCRUBBED]`` and ordinary text is left alone; a loop's own env values (8 characters or more) too; a stream
scrubbed chunk by chunk equals the whole scrubbed at once, however it is cut; a megabyte of the worst inputs for
each pattern scrubs in one linear pass."""

from __future__ import annotations

import time

import pytest

from loopsq.domain.scrub import (
    MAX_HOLD_BYTES,
    MIN_SECRET_LENGTH,
    PATTERNS,
    SHAPES,
    Scrubber,
    StreamScrubber,
    scrub,
    secret_values,
)

S = "[SCRUBBED]"
ANTHROPIC = "sk-ant-api03-" + "Ab3_dE-fGh1" * 8 + "AA"
OPENAI = "sk-proj-" + "xY9zQ2-wE4_rT6" * 4
OPENAI_OLD = "sk-" + "T3BlbkFJ" * 6
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM2z\nq1w/2kpZ+9c0c1K5w==\n"
       "-----END RSA PRIVATE KEY-----")
ENCRYPTED_PEM = ("-----BEGIN ENCRYPTED PRIVATE KEY-----\r\nProc-Type: 4,ENCRYPTED\r\nDEK-Info: AES-128-CBC,0A1B2C\r\n"
                 "\r\nMIIFHDBOBgkqhkiG9w0BBQ0wQTApBgkqhkiG9w0BBQwwHAQI\r\n-----END ENCRYPTED PRIVATE KEY-----")

# (name, text, scrubbed): every pattern, inside ordinary text
CASES = [
    ("anthropic", f"ANTHROPIC_API_KEY={ANTHROPIC} set", f"ANTHROPIC_API_KEY={S} set"),
    ("openai project key", f'{{"key": "{OPENAI}"}}', f'{{"key": "{S}"}}'),
    ("openai classic key", f"export OPENAI_API_KEY='{OPENAI_OLD}'", f"export OPENAI_API_KEY='{S}'"),
    ("aws access key id", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n", f"aws_access_key_id = {S}\n"),
    ("aws temporary key id", "ASIAY34FZKBOKMUTVV7A,", f"{S},"),
    ("github classic", "token ghp_" + "a1B2c3D4e5" * 4 + " ok", f"token {S} ok"),
    ("github oauth", "gho_" + "Z9y8X7w6V5" * 4, S),
    ("github fine-grained", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUV",
     S),
    ("slack bot", "SLACK=xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", f"SLACK={S}"),
    ("slack user", "(xoxp-1111-2222-3333-abcdefabcdef)", f"({S})"),
    ("slack app", "xoxa-2-abcdef0123456789", S),
    ("pem block", f"key:\n{PEM}\ndone", f"key:\n{S}\ndone"),
    ("encrypted pem block", f"{ENCRYPTED_PEM}\r\n", f"{S}\r\n"),
    ("pem block without its end", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5v\nAAAA\n\nnext",
     f"{S}\n\nnext"),
    ("pem block inside json", '{"text":"-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBg\\nkqhkiG9w==\\n'
     '-----END PRIVATE KEY-----\\n"}', f'{{"text":"{S}\\n"}}'),
    ("bearer header", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig-_x", f"Authorization: Bearer {S}"),
    ("bearer lower case", "curl -H 'authorization: bearer abcd1234efgh5678'", f"curl -H 'authorization: bearer {S}'"),
    ("bearer upper case", "AUTHORIZATION: BEARER abcd1234efgh5678", f"AUTHORIZATION: BEARER {S}"),
    ("several in a line", f"{OPENAI} and AKIAIOSFODNN7EXAMPLE", f"{S} and {S}"),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _n, t, e in CASES], ids=[n for n, _t, _e in CASES])
def test_each_secret_shape_is_replaced(text: str, expected: str) -> None:
    assert scrub(text) == expected
    assert SHAPES.data(text.encode()) == expected.encode()


def test_every_pattern_has_a_case() -> None:
    assert [name for name, _regex in PATTERNS] == ["anthropic", "openai", "aws-access-key-id", "github", "slack",
                                                   "pem-private-key", "bearer"]


ORDINARY = [
    "task-runner-0123456789abcdefghijklmnop finished",  # sk- inside a word
    "risk-assessment-2024-quarterly-report-final.pdf",
    "sk-learn-compatible-estimators-and-transformers",  # no digit: a word, not a key
    "sk-12345",  # too short
    "AKIA-not-a-key AKIAIOSFODNN7EXAMPLEX",  # a 17th character: not an access key id
    "ghp_short gh_pages github_pattern",
    "xoxb- alone, xox-foo",
    "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIE\n-----END CERTIFICATE-----",
    "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0D\n-----END PUBLIC KEY-----",
    "The bearer of this letter; Bearer short; bearer",
    "é ü 漢字 emoji 🎉 \x00 \t tabs",
    "",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert scrub(text) == text
    assert SHAPES.data(text.encode()) == text.encode()


def test_a_loops_own_env_values_of_8_characters_or_more_are_scrubbed_whole() -> None:
    env = {"DB_PASSWORD": "hunter2-correct-horse", "SHORT": "abc1234", "PORT": "5432", "NUM": 12345678,
           "PREFIX": "hunter2-correct"}
    assert MIN_SECRET_LENGTH == 8
    assert secret_values(env) == ("hunter2-correct-horse", "hunter2-correct")
    assert secret_values(None) == () and secret_values({"A": None}) == ()  # type: ignore[dict-item]
    scrubber = Scrubber(secret_values(env))
    text = "connect with hunter2-correct-horse (prefix hunter2-correct), pin abc1234 on 5432"
    assert scrubber.text(text) == f"connect with {S} (prefix {S}), pin abc1234 on 5432"
    assert scrubber.data(text.encode()) == f"connect with {S} (prefix {S}), pin abc1234 on 5432".encode()
    assert scrub("x hunter2-correct-horse x", ["hunter2-correct-horse"]) == f"x {S} x"


def test_nested_values_are_scrubbed_and_other_types_kept() -> None:
    payload = {"error": f"auth failed for {OPENAI}", "exitCode": 1, "list": [ANTHROPIC, 2, None], "ok": True}
    assert SHAPES.tree(payload) == {"error": f"auth failed for {S}", "exitCode": 1, "list": [S, 2, None], "ok": True}
    assert SHAPES.optional(None) is None


DOCUMENT = ("log line one\n" + f"using {OPENAI} now\r\n" + "progress 10%\rprogress 90%\r" + PEM + "\n"
            + "Authorization: Bearer abcdefgh12345678\n" + "tail without newline " + ANTHROPIC)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 4096])
def test_a_stream_scrubbed_chunk_by_chunk_equals_the_whole_scrubbed_however_it_is_cut(size: int) -> None:
    data = DOCUMENT.encode()
    stream = StreamScrubber(Scrubber(["hunter2-correct-horse"]))
    out = b"".join(stream.feed(data[i:i + size]) for i in range(0, len(data), size)) + stream.finish()
    assert out == Scrubber(["hunter2-correct-horse"]).data(data)
    assert OPENAI.encode() not in out and b"MIIEow" not in out and ANTHROPIC.encode() not in out


def test_a_stream_lets_complete_lines_through_at_once_and_holds_an_open_key_block() -> None:
    stream = StreamScrubber(SHAPES)
    assert stream.feed(b"first line\nsecond li") == b"first line\n"
    assert stream.feed(b"ne\n-----BEGIN PRIVATE KEY-----\nMIIEvQ\n") == b"second line\n"  # the block is held
    assert stream.feed(b"kqhkiG9w==\n-----END PRIVATE KEY-----\nafter\n") == f"{S}\nafter\n".encode()
    assert stream.finish() == b""


def test_what_a_stream_holds_is_bounded() -> None:
    stream = StreamScrubber(SHAPES)
    line = b"x" * 1000 + b" "
    passed = sum(len(stream.feed(line)) for _ in range(300))  # 300 KB without a line break
    held = 300 * len(line) - passed
    assert 0 < held <= MAX_HOLD_BYTES
    assert passed + len(stream.finish()) == 300 * len(line)


MB = 1_048_576
#: The worst megabyte for each pattern: its prefix over and over, prefixes with almost enough after them, a key
#: block's lines without end, a long run of token characters.
WORST = {
    "sk- repeated": "sk-" * (MB // 3),
    "sk- almost keys": (" sk-" + "a" * 25) * (MB // 29),
    "sk-ant- almost keys": (" sk-ant-" + "a" * 19) * (MB // 27),
    "AKIA repeated": "AKIA" * (MB // 4),
    "gh prefixes": "ghp_ gho_ github_pat_ " * (MB // 22),
    "xox prefixes": "xoxb-" * (MB // 5),
    "BEGIN headers": "-----BEGIN PRIVATE KEY-----\n" * (MB // 28),
    "BEGIN with long names": ("-----BEGIN " + "A " * 40) * (MB // 91),
    "one key block of 1 MB": "-----BEGIN RSA PRIVATE KEY-----" + "\nQUJD" * (MB // 5),
    "Bearer repeated": "Bearer " * (MB // 7),
    "dashes": "-" * MB,
    "token characters": "a" * MB,
    "line breaks": "\n" * MB,
}


@pytest.mark.parametrize("name", list(WORST))
def test_a_megabyte_scrubs_in_one_linear_pass(name: str) -> None:
    text = WORST[name]
    started = time.perf_counter()
    scrub(text)
    SHAPES.data(text.encode())
    elapsed = time.perf_counter() - started
    print(f"{name}: {elapsed * 1000:.0f} ms for text and bytes")
    assert elapsed < 20  # a generous bound: a catastrophic backtrack takes hours, a linear pass ~0.1 s
