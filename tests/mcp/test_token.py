"""The operator token: issued 0600 into the home, matched exactly, and refused when the
file could have been read by anyone else (each refusal beside its accepted control)."""

from __future__ import annotations

import os
from pathlib import Path

from charter.mcp import issue_token, token_matches, token_path


def test_a_token_is_private_and_matched_exactly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    token = issue_token(home)
    assert len(token) == 64
    assert token_path(home).stat().st_mode & 0o777 == 0o600
    assert token_matches(home, token)  # the control
    for wrong in ("", token[:-1], token + "0", token.upper(), " " + token):
        assert not token_matches(home, wrong), wrong


def test_a_new_token_replaces_the_old_at_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    old = issue_token(home)
    new = issue_token(home)
    assert new != old
    assert token_matches(home, new)
    assert not token_matches(home, old)
    assert [p.name for p in home.iterdir()] == ["mcp-token"]  # no scratch file left


def test_a_token_others_could_read_is_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    token = issue_token(home)
    path = token_path(home)
    for mode in (0o640, 0o604):
        path.chmod(mode)
        assert not token_matches(home, token), oct(mode)
    path.chmod(0o600)
    assert token_matches(home, token)  # the control: private again, accepted


def test_a_link_or_a_missing_file_refuses_every_token(tmp_path: Path) -> None:
    home = tmp_path / "home"
    token = issue_token(home)
    elsewhere = tmp_path / "elsewhere"
    os.replace(token_path(home), elsewhere)
    assert not token_matches(home, token)  # missing
    token_path(home).symlink_to(elsewhere)
    assert not token_matches(home, token)  # a link is not followed
    token_path(home).unlink()
    os.replace(elsewhere, token_path(home))
    assert token_matches(home, token)  # the control: the file itself
