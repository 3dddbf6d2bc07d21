"""``charter checkpoint key``: the journal's verifier keys from its own entries, read
only (it runs on an auditor's copy), through the ledger's location resolution and not
charter.app: it loads no database driver the journal does not use."""

from __future__ import annotations

import json

import click

from charter.audit.keys import KEY_HISTORY_FORMAT
from charter.audit.tree import anchor_key, key_history
from charter.cli._common import Ctx
from charter.cli._tree import open_ledger
from charter.cli.proofs import write_text
from charter.core.errors import InternalError

__all__ = ["checkpoint_key"]


@click.command("key")
@click.option(
    "--current", is_flag=True, help="The key that signs checkpoints now (after rotations)."
)
@click.option(
    "--history",
    "history_out",
    metavar="FILE",
    help="Also write the key history (the anchor and each rotation, signed by both keys) "
    "to FILE, for --key-history of proof verify and witness cosign.",
)
@click.pass_obj
def checkpoint_key(ctx: Ctx, current: bool, history_out: str | None) -> None:
    """Print the journal's first verifier key (the trust anchor its key history starts
    from), or with --current the one that signs checkpoints now."""
    journal = open_ledger(ctx, read_only=True)
    if journal is None:
        raise InternalError("the ledger opens any journal to read")
    with journal:
        anchor = anchor_key(journal)
        key = anchor
        if current or history_out is not None:
            history, size, rotations = key_history(journal)
            if current:
                key = history.note_key_for(size)
            doc = {"anchor": anchor.text(), "format": KEY_HISTORY_FORMAT, "rotations": rotations}
            write_text(history_out, json.dumps(doc, sort_keys=True, indent=1) + "\n")
    ctx.emit({"key": key.text(), "name": key.name}, key.text())
