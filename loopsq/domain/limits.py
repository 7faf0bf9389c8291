"""Every bound loopsq puts on its input, in one place: body and file sizes, field lengths, list sizes, the minimum
interval and lease, and page sizes.

The CLI, the SDK (through the domain validators), the HTTP API (and its OpenAPI document) and spec-file reading all
take their bounds from here, the README lists each one, and ``tests/unit/test_limits.py`` asserts them. Lengths
count characters (code points), except the byte sizes of bodies and files.
"""

from __future__ import annotations

from loopsq.domain import durations

# -- sizes -----------------------------------------------------------------------------------------------------
#: An HTTP API request body, in bytes: a larger one is answered 413 before it is parsed.
MAX_BODY_BYTES = 1_048_576
#: A workflow spec file, in bytes: a larger file (or an endless one such as ``/dev/zero``) is refused after
#: reading at most this much plus one byte.
MAX_SPEC_FILE_BYTES = MAX_BODY_BYTES

# -- loops -----------------------------------------------------------------------------------------------------
#: A loop or workflow name (before trimming).
MAX_NAME_LENGTH = 200
#: A loop or workflow description.
MAX_DESCRIPTION_LENGTH = 4_096
#: An IANA time zone name (the longest real one has 32 characters).
MAX_TIMEZONE_LENGTH = 64
#: A time given as text: ``schedule.at``, ``expiresAt``, ``--at``, ``--expires-at``.
MAX_TIME_LENGTH = 64
#: A cron expression (checked before it is parsed).
MAX_CRON_LENGTH = 256
#: The shortest interval of an interval loop (``--every``, ``everyMs``) and of a dynamic loop (``minIntervalMs``).
MIN_EVERY_MS = durations.MS_PER_UNIT["s"]
#: The shortest run lease (``--lease``, ``leaseMs``): a lease is renewed at a third of its length on a 200 ms beat,
#: so 5 s leaves three renewals and 25 beats before it can lapse.
MIN_LEASE_MS = 5 * durations.MS_PER_UNIT["s"]
#: The longest duration anywhere (intervals, leases, retry delays, timeouts): 100 years.
MAX_MS = durations.MAX_DURATION_MS
#: The largest ``catchUpLimit``, ``maxAttempts`` and ``pauseAfterFailures``.
MAX_COUNT = 10_000
#: The largest limit of a fleet-wide pool (``loopsq pool set --limit``, ``{"limit"}``).
MAX_POOL_LIMIT = 10_000

# -- targets ---------------------------------------------------------------------------------------------------
#: A command target's ``command`` (``--cmd``).
MAX_COMMAND_LENGTH = 16_384
#: Items of ``args`` and of an agent's ``extraArgs`` (``--extra-arg``).
MAX_ARGS = 256
#: One item of ``args`` or ``extraArgs``.
MAX_ARG_LENGTH = 4_096
#: A working directory (``cwd``, ``--cwd``): Linux's PATH_MAX.
MAX_CWD_LENGTH = 4_096
#: An agent prompt (``--prompt``): 32,000 characters fit one argv argument (the kernel's 128 KiB) in any encoding.
MAX_PROMPT_LENGTH = 32_000
#: Short words: an agent's ``provider``, ``model`` and ``agent``, an account's ``profile`` and ``tool``.
MAX_WORD_LENGTH = 200
#: Entries of a command's ``env`` and of a workflow target's ``input``.
MAX_ENV_ENTRIES = 128
#: An ``env`` (or ``input``) key.
MAX_ENV_KEY_LENGTH = 256
#: An ``env`` (or ``input``) value.
MAX_ENV_VALUE_LENGTH = 16_384
#: What an ``env`` key must match (a POSIX shell variable name).
ENV_KEY_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"

# -- workflows -------------------------------------------------------------------------------------------------
#: Steps of one workflow spec.
MAX_STEPS = 100
#: A step id.
MAX_STEP_ID_LENGTH = 64
#: What a step id must match: letters, digits, ``_``, ``.`` and ``-``, not starting with ``.`` or ``-``.
STEP_ID_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
#: The largest ``maxParallel``.
MAX_PARALLEL = MAX_STEPS
#: A workflow ``version`` (a JSON number): at most this in absolute value (JavaScript's safe integers).
MAX_VERSION = 2**53 - 1
#: A cancel or recover reason (``--reason``, ``{"reason"}``).
MAX_REASON_LENGTH = 500

# -- triggers and reads ------------------------------------------------------------------------------------------
#: A trigger's idempotency key (``--key``, ``idempotency_key=``, the ``Idempotency-Key`` header).
MAX_IDEMPOTENCY_KEY_LENGTH = 200
#: Page size of run and workflow-run lists (``--limit``, ``?limit=``, ``LoopsClient.runs(limit=)``).
MAX_PAGE_LIMIT = 1_000  # issue 12: `runs NAME --limit 1000` reads a long archived history
#: Page size of a workflow run's events (``workflows events --limit``, ``?limit=``).
MAX_EVENT_PAGE_LIMIT = 10_000
#: Page size of loop and workflow-spec lists in the API (``?limit=``).
MAX_LIST_LIMIT = 1_000
#: The largest ``?offset=``.
MAX_OFFSET = 100_000

# -- the web app -----------------------------------------------------------------------------------------------
#: The shortest dashboard session lifetime (``loopsq web --session-ttl``; the default is 12 h).
MIN_SESSION_TTL_MS = 60_000
