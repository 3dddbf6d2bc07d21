"""Honeytokens: unique per sandbox, and a touch of any of them is a quarantine naming it."""

from __future__ import annotations

import secrets

import pytest

from charter.core.destination import check_destination
from charter.core.events import canonical_json, event_class
from charter.supervision import (
    CREDENTIAL_DIR,
    CanariesPlanted,
    CanaryMismatchError,
    CanaryNonceError,
    CanaryTouch,
    QuarantineVerdict,
    canaries_for,
    touched,
)


def touch(sandbox_id: str, kind: str, value: str) -> CanaryTouch:
    return CanaryTouch(sandbox_id=sandbox_id, kind=kind, value=value, at_ms=1)  # type: ignore[arg-type]


def test_canaries_are_unique_per_sandbox() -> None:
    sets = [canaries_for(f"sbx{i}", secrets.token_bytes(16)) for i in range(1000)]
    for field in ("token", "credential_file", "secret_name", "egress_destination"):
        assert len({getattr(c, field) for c in sets}) == 1000, field
    first = sets[0]
    assert first.credential_file.startswith(f"{CREDENTIAL_DIR}/")
    # The decoy file names the other two decoys, as a leaked credential would.
    text = first.credential_text()
    assert first.secret_name in text
    assert first.egress_destination in text
    # The decoy destination is a destination the grant vocabulary accepts.
    check_destination(first.egress_destination)


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("credential_file", "{file}"),
        ("credential_file", "/workspace/{file}"),
        ("secret_name", "{secret}"),
        ("egress_destination", "{dest}"),
        ("egress_destination", "{host}:8443"),
        ("egress_destination", "{host}"),
    ],
)
def test_a_touch_of_a_canary_is_a_quarantine_naming_it(kind: str, value: str) -> None:
    canaries = canaries_for("sbx1", secrets.token_bytes(16))
    filled = value.format(
        file=canaries.credential_file, secret=canaries.secret_name,
        dest=canaries.egress_destination, host=canaries.egress_destination.split(":")[0],
    )  # fmt: skip
    verdict = touched(
        canaries, touch("sbx1", kind, filled), lineage="w1", task_class="review", policy_version=3
    )
    assert isinstance(verdict, QuarantineVerdict)
    (evidence,) = verdict.evidence
    assert evidence.signal == "canary"
    assert evidence.policy_version == 3
    assert evidence.canary is not None
    assert evidence.canary.startswith(f"{kind}:")
    assert evidence.canary.split(":", 1)[1] in (
        canaries.credential_file, canaries.secret_name, canaries.egress_destination,
    )  # fmt: skip
    assert verdict.stream() == "supervise:w1"


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("credential_file", "notes.txt"),
        ("credential_file", f"{CREDENTIAL_DIR}/other.ini"),
        ("secret_name", "deploy-key"),
        ("egress_destination", "api.example.com:443"),
    ],
)
def test_what_is_not_a_canary_is_no_verdict(kind: str, value: str) -> None:
    canaries = canaries_for("sbx1", secrets.token_bytes(16))
    assert (
        touched(canaries, touch("sbx1", kind, value), lineage="w1", task_class="r",
                policy_version=1)
        is None
    )  # fmt: skip


def test_another_sandboxs_canary_is_not_this_ones() -> None:
    mine, theirs = (canaries_for(s, secrets.token_bytes(16)) for s in ("a", "b"))
    hit = touch("a", "secret_name", theirs.secret_name)
    assert touched(mine, hit, lineage="w", task_class="r", policy_version=1) is None
    with pytest.raises(CanaryMismatchError):
        touched(theirs, hit, lineage="w", task_class="r", policy_version=1)


def test_a_short_nonce_is_refused() -> None:
    with pytest.raises(CanaryNonceError):
        canaries_for("sbx", b"\0" * 15)


def test_the_planted_canaries_are_an_event_that_round_trips() -> None:
    canaries = canaries_for("sbx9", secrets.token_bytes(16))
    planted = canaries.planted("w9")
    stored = canonical_json(planted.payload())
    cls = event_class(CanariesPlanted.topic())
    assert cls.model_validate_json(stored) == planted
    assert planted.stream() == "canaries:sbx9"
