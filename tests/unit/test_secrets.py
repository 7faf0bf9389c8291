"""Secrets given by file (``system.secrets``): what is read, and one line for each way a file can be wrong."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from loopsq.errors import ValidationError
from loopsq.system.secrets import MAX_SECRET_BYTES, secret_from_env


def test_the_variable_wins_when_set_alone_and_the_file_is_read_stripped_when_named(tmp_path: Path) -> None:
    secret = tmp_path / "url"
    secret.write_text("  redis://:pw@h:1/0\n\n")
    assert secret_from_env("LOOPSQ_REDIS_URL", {"LOOPSQ_REDIS_URL": "redis://h:1/0"}) == ("redis://h:1/0",
                                                                                          "LOOPSQ_REDIS_URL")
    assert secret_from_env("LOOPSQ_REDIS_URL", {"LOOPSQ_REDIS_URL_FILE": str(secret)}) == (
        "redis://:pw@h:1/0", "LOOPSQ_REDIS_URL_FILE")
    assert secret_from_env("LOOPSQ_REDIS_URL", {"LOOPSQ_REDIS_URL": " ", "LOOPSQ_REDIS_URL_FILE": ""}) is None


def test_a_symlink_to_a_regular_file_is_read_as_kubernetes_mounts_secrets(tmp_path: Path) -> None:
    (tmp_path / "..data").mkdir()
    (tmp_path / "..data" / "token").write_text("t0ken-0123456789abcdef")
    (tmp_path / "token").symlink_to(tmp_path / "..data" / "token")
    assert secret_from_env("LOOPSQ_API_TOKEN", {"LOOPSQ_API_TOKEN_FILE": str(tmp_path / "token")})[0] == \
        "t0ken-0123456789abcdef"  # type: ignore[index]


def refused(tmp_path: Path, env: dict[str, str]) -> str:
    with pytest.raises(ValidationError) as caught:
        secret_from_env("LOOPSQ_API_TOKEN", env)
    return str(caught.value).replace(str(tmp_path), "TMP")


def test_each_wrong_file_is_one_line_naming_the_variable_and_the_path_never_the_value(tmp_path: Path) -> None:
    env = {"LOOPSQ_API_TOKEN": "abc", "LOOPSQ_API_TOKEN_FILE": "/x"}
    assert refused(tmp_path, env) == "LOOPSQ_API_TOKEN and LOOPSQ_API_TOKEN_FILE are both set: set one of them"

    def of(path: Path) -> dict[str, str]:
        return {"LOOPSQ_API_TOKEN_FILE": str(path)}

    assert refused(tmp_path, of(tmp_path / "none")) == \
        "LOOPSQ_API_TOKEN_FILE: cannot read 'TMP/none': No such file or directory"
    assert refused(tmp_path, of(tmp_path)) == "LOOPSQ_API_TOKEN_FILE: 'TMP' is not a regular file"
    (tmp_path / "empty").write_text(" \n")
    assert refused(tmp_path, of(tmp_path / "empty")) == "LOOPSQ_API_TOKEN_FILE: 'TMP/empty' is empty"
    (tmp_path / "big").write_bytes(b"x" * (MAX_SECRET_BYTES + 1))
    assert refused(tmp_path, of(tmp_path / "big")) == \
        f"LOOPSQ_API_TOKEN_FILE: 'TMP/big' is larger than {MAX_SECRET_BYTES} bytes"
    (tmp_path / "latin1").write_bytes(b"caf\xe9-token-0123456789")
    assert refused(tmp_path, of(tmp_path / "latin1")) == "LOOPSQ_API_TOKEN_FILE: 'TMP/latin1' is not UTF-8"
    (tmp_path / "max").write_bytes(b"y" * MAX_SECRET_BYTES)  # the largest taken
    assert len(secret_from_env("LOOPSQ_API_TOKEN", of(tmp_path / "max"))[0]) == MAX_SECRET_BYTES  # type: ignore[index]


def test_a_fifo_is_refused_at_once_rather_than_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(refused(tmp_path, {"LOOPSQ_API_TOKEN_FILE": str(fifo)})),
                              daemon=True)
    reader.start()
    reader.join(10)
    assert result == ["LOOPSQ_API_TOKEN_FILE: 'TMP/fifo' is not a regular file"]
