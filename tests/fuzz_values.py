"""Hostile values for the fuzz tests: over-long (just past each documented bound, and far past), laden with control,
format, bidi and zero-width characters, or with the separators of argv, env, paths, keys and lines."""

from __future__ import annotations

from hypothesis import strategies as st

from loopsq.domain import limits

#: Lengths just past each bound of ``limits`` (and one far past all of them).
LENGTHS = sorted({bound + 1 for bound in (limits.MAX_NAME_LENGTH, limits.MAX_DESCRIPTION_LENGTH,
                                          limits.MAX_TIMEZONE_LENGTH, limits.MAX_TIME_LENGTH, limits.MAX_CRON_LENGTH,
                                          limits.MAX_COMMAND_LENGTH, limits.MAX_ARG_LENGTH, limits.MAX_CWD_LENGTH,
                                          limits.MAX_PROMPT_LENGTH, limits.MAX_WORD_LENGTH, limits.MAX_ENV_KEY_LENGTH,
                                          limits.MAX_STEP_ID_LENGTH, limits.MAX_IDEMPOTENCY_KEY_LENGTH,
                                          limits.MAX_REASON_LENGTH)} | {100_000})
SEPARATORS = "=,;:|&$`'\"\\ \t\n\r/-.*@#{}[]()<>!?~%^+\x00"
INVISIBLE = st.characters(categories=("Cc", "Cf", "Zl", "Zp"))

OVER_LONG = st.builds(lambda unit, length: (unit * length)[:length],
                      st.sampled_from(["x", "é", "9", "a b", "\u200b", "-", "=", "日"]), st.sampled_from(LENGTHS))
CONTROL_LADEN = st.text(alphabet=INVISIBLE | st.sampled_from("ab1 "), min_size=1, max_size=16).filter(
    lambda text: any(not ch.isalnum() and ch != " " for ch in text))
SEPARATOR_LADEN = st.text(alphabet=st.sampled_from(SEPARATORS + "ab"), min_size=1, max_size=16)

#: Any hostile text.
HOSTILE = st.one_of(OVER_LONG, CONTROL_LADEN, SEPARATOR_LADEN)
