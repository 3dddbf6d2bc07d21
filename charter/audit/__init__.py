"""The auditor's side. ``charter.audit`` itself imports only core (no eventsourcing, no
database driver), so an offline verifier can be built on it: the chain walk and its
report. :mod:`charter.audit.journal` verifies a whole journal in parallel.

Pure (usable offline, with neither eventsourcing nor a driver loaded): ``chain``,
``merkle`` (RFC 6962 tree, proofs, RFC 9162 verification), ``note`` (C2SP signed notes,
checkpoints, cosignatures), ``proofs`` (proof texts), ``keys`` (the journal key's
history), ``witness``, ``bundle`` (export bundles and their verification), ``semantic``
(the semantic audits), ``siem`` (flat JSON lines). On a journal: ``tree`` (the Merkle
follower, proofs from stored nodes, checkpoints, ``verify_extension``), ``export`` and
``journal``. docs/VERIFYING.md is the byte-exact specification.

The names below are loaded when first asked for: importing the package (as importing
``charter.audit.note`` does) loads no pydantic, so ``merkle``, ``note``, ``proofs`` and
``keys`` start light (the auditor's ``charter proof`` commands)."""

from typing import TYPE_CHECKING

from charter.core.lazy import lazy_names

if TYPE_CHECKING:
    from charter.audit.chain import (
        ChainBrokenError,
        ChainHead,
        ChainReport,
        ChainSource,
        Fault,
        audit_chain,
        finish_report,
        parse_head,
        verify_chain,
    )
    from charter.audit.rotation import JournalKeyRotated

__all__ = [
    "ChainBrokenError",
    "ChainHead",
    "ChainReport",
    "ChainSource",
    "Fault",
    "JournalKeyRotated",
    "audit_chain",
    "finish_report",
    "parse_head",
    "verify_chain",
]

_LAZY = dict.fromkeys(__all__, "charter.audit.chain") | {
    "JournalKeyRotated": "charter.audit.rotation"
}


__getattr__ = lazy_names(__name__, _LAZY)
