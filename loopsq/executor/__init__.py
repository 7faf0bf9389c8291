"""The executor: run one command or coding-agent target as a process group and report how it ended.

Public API: ``build_spec``, ``agent_args``, ``preflight_target``, ``execute_target`` and their value types;
``resolve_account_env`` for account routing (§6); ``preflight`` checks a loop's target without running it.
May import ``loopsq.system``, ``loopsq.domain`` and ``loopsq.errors``; never state, the engine or above.
"""

from __future__ import annotations

from loopsq.executor.accounts import AUTH_ENV_KEYS, PROFILE_DIR_VARS, resolve_account_env
from loopsq.executor.output import DEFAULT_MAX_OUTPUT_BYTES, BoundedOutput
from loopsq.executor.result import ExecutorResult, SpawnInfo
from loopsq.executor.run import execute_target, preflight_target
from loopsq.executor.spec import (
    DEFAULT_TIMEOUT_MS,
    PROVIDER_EXECUTABLES,
    CommandSpec,
    RunMetadata,
    agent_args,
    build_spec,
    check_executable,
    compose_env,
)

__all__ = [
    "AUTH_ENV_KEYS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_TIMEOUT_MS",
    "PROFILE_DIR_VARS",
    "PROVIDER_EXECUTABLES",
    "BoundedOutput",
    "CommandSpec",
    "ExecutorResult",
    "RunMetadata",
    "SpawnInfo",
    "agent_args",
    "build_spec",
    "check_executable",
    "compose_env",
    "execute_target",
    "preflight_target",
    "resolve_account_env",
]
