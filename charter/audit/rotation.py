"""The journal key's rotation event, ``JournalKeyRotated`` (a pydantic event, like every
journal entry), and :func:`rotation`, which makes one signed by the old and the new key.
What a rotation means and how it is checked is :mod:`charter.audit.keys` (pure: no
pydantic, for the auditor's light commands)."""

from __future__ import annotations

from nacl.signing import SigningKey

from charter.audit.keys import KEY_STREAM
from charter.core.events import Event
from charter.core.framing import key_rotation_signing_input

__all__ = ["JournalKeyRotated", "rotation"]


class JournalKeyRotated(Event):
    """The journal's signing key changes from ``old_key`` to ``new_key`` (hex Ed25519
    public keys), signed by both over the rotation statement."""

    type_name = "JournalKeyRotated"

    origin: str
    old_key: str
    new_key: str
    old_signature: str
    new_signature: str

    def stream(self) -> str:
        return KEY_STREAM


def rotation(origin: str, old: SigningKey, new: SigningKey) -> JournalKeyRotated:
    old_pub, new_pub = bytes(old.verify_key), bytes(new.verify_key)
    statement = key_rotation_signing_input(origin, old_pub, new_pub)
    return JournalKeyRotated(
        origin=origin,
        old_key=old_pub.hex(),
        new_key=new_pub.hex(),
        old_signature=old.sign(statement).signature.hex(),
        new_signature=new.sign(statement).signature.hex(),
    )
