"""Honeytokens: canaries no honest worker touches, unique per sandbox, and the rule that
a touch is a quarantine naming the canary.

Each sandbox gets three, derived from a per-sandbox random nonce the caller draws
(``secrets.token_bytes(16)``), so this module stays pure and a canary of one sandbox
says nothing about another's:

- a decoy credential file in its workspace (``credential_file``, relative to the
  workspace root), whose text names the other two, as a leaked secret would;
- a decoy secret name behind the door (``secret_name``);
- a decoy egress destination (``egress_destination``, under the reserved ``.invalid``
  top-level domain, so nothing real is ever reached by that name).

Where Charter sees each touch: the host-side watch of the workspace file (see
``charter.sandbox.CanaryWatch``), the door's secret call, the egress broker's attempt.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from charter.supervision.errors import CanaryMismatchError, CanaryNonceError
from charter.supervision.events import CanariesPlanted, Evidence, QuarantineVerdict

__all__ = [
    "CREDENTIAL_DIR",
    "CanaryKind",
    "CanarySet",
    "CanaryTouch",
    "canaries_for",
    "touched",
]

CREDENTIAL_DIR = ".charter-secrets"
"""The workspace directory holding the decoy credential file (docs/door.md tells
worker authors that nothing under it is theirs to read)."""

CanaryKind = Literal["credential_file", "secret_name", "egress_destination"]


class CanarySet(BaseModel):
    """The canaries of sandbox ``sandbox_id``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sandbox_id: str = Field(min_length=1)
    token: str = Field(pattern=r"^[0-9a-f]{32,}$")
    credential_file: str
    secret_name: str
    egress_destination: str

    def credential_text(self) -> str:
        """What the decoy file holds: a plausible credential naming the other decoys."""
        return (
            "[charter-deploy]\n"
            f"endpoint = https://{self.egress_destination}/v1/secrets\n"
            f"secret = {self.secret_name}\n"
            f"token = {self.token}\n"
        )

    def planted(self, lineage: str | None) -> CanariesPlanted:
        return CanariesPlanted(
            sandbox_id=self.sandbox_id, lineage=lineage,
            credential_file=self.credential_file, secret_name=self.secret_name,
            egress_destination=self.egress_destination,
        )  # fmt: skip

    def match(self, kind: CanaryKind, value: str) -> bool:
        """Whether ``value`` (a workspace path, a secret name, a ``host[:port]``) is this
        set's canary of ``kind``. A destination matches by host, on any port."""
        match kind:
            case "credential_file":
                return value.strip("/").removeprefix("workspace/") == self.credential_file
            case "secret_name":
                return value == self.secret_name
            case "egress_destination":
                host = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
                return host.lower().rstrip(".") == self.egress_destination.split(":")[0]


def canaries_for(sandbox_id: str, nonce: bytes) -> CanarySet:
    """The canaries of ``sandbox_id`` from a fresh random ``nonce`` (16 bytes or more)."""
    if len(nonce) < 16:
        raise CanaryNonceError("a canary nonce has at least 16 random bytes")
    token = nonce.hex()
    short = token[:12]
    return CanarySet(
        sandbox_id=sandbox_id,
        token=token,
        credential_file=f"{CREDENTIAL_DIR}/deploy-{short}.ini",
        secret_name=f"deploy-key-{short}",
        egress_destination=f"vault-{short}.charter-canary.invalid:443",
    )


class CanaryTouch(BaseModel):
    """Something a sandbox did that may touch a canary, as the place that saw it reports."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sandbox_id: str = Field(min_length=1)
    kind: CanaryKind
    value: str
    at_ms: int = Field(ge=0)


def touched(
    canaries: CanarySet,
    touch: CanaryTouch,
    *,
    lineage: str,
    task_class: str,
    policy_version: int,
) -> QuarantineVerdict | None:
    """A quarantine naming the canary when ``touch`` touched one of ``canaries``, else
    None. Whatever the policy says of behaviour, a touch is always a quarantine."""
    if touch.sandbox_id != canaries.sandbox_id:
        raise CanaryMismatchError(
            f"a touch in sandbox {touch.sandbox_id} cannot be held against the canaries of "
            f"sandbox {canaries.sandbox_id}"
        )
    if not canaries.match(touch.kind, touch.value):
        return None
    name = {
        "credential_file": canaries.credential_file,
        "secret_name": canaries.secret_name,
        "egress_destination": canaries.egress_destination,
    }[touch.kind]
    return QuarantineVerdict(
        lineage=lineage,
        sandbox_id=canaries.sandbox_id,
        task_class=task_class,
        evidence=(
            Evidence(
                signal="canary",
                observed=1,
                upper=0,
                threshold=0,
                policy_version=policy_version,
                canary=f"{touch.kind}:{name}",
            ),
        ),
    )
