"""The gateway's API keys alone: the keys file (re-read when it changes), the bearer header,
and the cache salt each key gets instead of the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshnet.gateway.api_keys import RECHECK_SECONDS, ApiKeys, ApiKeysError, bearer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def keys_file(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "keys"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_a_key_of_the_file_is_a_caller_and_anything_else_is_not(tmp_path: Path) -> None:
    keys = ApiKeys(keys_file(tmp_path, "# the team's keys", "sk-alpha", "", "  sk-beta  "))
    alpha, beta = keys.caller("Bearer sk-alpha"), keys.caller("bearer sk-beta")
    assert alpha is not None and beta is not None
    assert alpha.salt != beta.salt and "sk-alpha" not in alpha.salt
    for header in (None, "", "Bearer", "Bearer sk-gamma", "Basic sk-alpha", "sk-alpha",
                   "Bearer sk-alph", "Bearer # the team's keys"):
        assert keys.caller(header) is None, header


def test_a_changed_file_is_read_again_and_an_emptied_one_keeps_the_keys(tmp_path: Path) -> None:
    clock = Clock()
    path = keys_file(tmp_path, "sk-old")
    keys = ApiKeys(path, clock)
    path.write_text("sk-new\n")
    os.utime(path, ns=(1, 1))  # a new stamp even within the file system's mtime granularity
    assert keys.caller("Bearer sk-old") is not None  # not looked at again yet
    clock.now += RECHECK_SECONDS
    assert keys.caller("Bearer sk-old") is None and keys.caller("Bearer sk-new") is not None
    path.write_text("\n")
    os.utime(path, ns=(2, 2))
    clock.now += RECHECK_SECONDS
    assert keys.caller("Bearer sk-new") is not None  # a half-written file opens nothing


def test_a_file_without_keys_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ApiKeysError, match="holds no key"):
        ApiKeys(keys_file(tmp_path, "# none yet"))
    with pytest.raises(ApiKeysError, match="cannot read"):
        ApiKeys(tmp_path / "missing")


def test_the_bearer_header_is_read_as_openai_clients_send_it() -> None:
    assert bearer("Bearer sk-1") == b"sk-1"
    assert bearer("Bearer   sk-1 ") == b"sk-1"
    assert bearer("Token sk-1") is None and bearer(None) is None
