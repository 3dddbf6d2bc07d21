"""The auditor's side. ``charter.audit`` itself imports only core (no eventsourcing, no
database driver), so an offline verifier can be built on it: the chain walk and its
report. :mod:`charter.audit.journal` verifies a whole journal in parallel."""

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

__all__ = [
    "ChainBrokenError",
    "ChainHead",
    "ChainReport",
    "ChainSource",
    "Fault",
    "audit_chain",
    "finish_report",
    "parse_head",
    "verify_chain",
]
