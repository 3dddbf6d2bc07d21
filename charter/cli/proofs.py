"""``charter checkpoint`` and ``charter proof``: the groups, and the offline commands.

``proof verify`` (offline) is defined here, over the pure verifier alone (``note``,
``proofs``, ``keys``): no journal, no tree, no app. Every other sub-command is imported
only when it runs (:class:`~charter.cli._lazy.LazyGroup`): ``checkpoint key`` reads the
journal's metadata (``_journal_key.py``), ``proof inclusion`` and ``consistency``
read the tree (``_tree.py``, by the ledger on SQLite), the rest sign or write it
(``audit.py``, through charter.app). bench/audit.py measures their start-up.
"""

from __future__ import annotations

from pathlib import Path

import click

from charter.audit.keys import KeyHistory
from charter.audit.note import NoteKey, SignedNote
from charter.audit.proofs import InclusionText
from charter.cli._common import Ctx
from charter.cli._lazy import LazyGroup, load
from charter.core.errors import BadInputError

__all__ = ["checkpoint", "key_for", "note_summary", "proof", "read_text", "write_text"]


def read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BadInputError(f"cannot read {path}: {e}") from e


def write_text(path: str | None, text: str) -> None:
    if path is not None:
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as e:
            raise BadInputError(f"cannot write {path}: {e}") from e


def note_summary(note: SignedNote) -> tuple[int, str]:
    lines = note.text.split("\n")
    return int(lines[1]), lines[2]


def key_for(vkey: str, history_file: str | None, note: SignedNote, what: str) -> NoteKey:
    """The key that must have signed ``note``: ``vkey`` itself, or, with a key-history
    file, the key that history (checked from ``vkey``, the anchor) gives for its size."""
    key = NoteKey.given(vkey, what)
    if history_file is None:
        return key
    history = KeyHistory.from_document(read_text(history_file), key)
    return history.note_key_for(note_summary(note)[0])


# -- checkpoint ------------------------------------------------------------------------


@click.group(
    cls=LazyGroup,
    invoke_without_command=True,
    lazy={
        "follow": "charter.cli.audit:checkpoint_follow",
        "key": "charter.cli._journal_key:checkpoint_key",
        "rotate": "charter.cli.audit:checkpoint_rotate",
        "verify": "charter.cli.audit:checkpoint_verify",
    },
)
@click.option("--out", "out", metavar="FILE", help="Also save the checkpoint to FILE.")
@click.pass_context
def checkpoint(click_ctx: click.Context, out: str | None) -> None:
    """Print a C2SP checkpoint of the journal (a signed note), signed with the journal's
    key; the Merkle tree is first brought up to the journal's head."""
    if click_ctx.invoked_subcommand is None:
        load("charter.cli.audit:checkpoint_now")(click_ctx.obj, out)


# -- proofs ----------------------------------------------------------------------------


@click.group(
    cls=LazyGroup,
    lazy={
        "inclusion": "charter.cli._tree:proof_inclusion",
        "consistency": "charter.cli._tree:proof_consistency",
    },
)
def proof() -> None:
    """Inclusion and consistency proofs of the journal's Merkle tree."""


@proof.command("verify")
@click.argument("file")
@click.option("--journal-key", "vkey", required=True, metavar="KEY", help="The log's verifier key.")
@click.option(
    "--key-history",
    "history_file",
    metavar="FILE",
    help="The journal's key history (`charter checkpoint key --history`), checked from "
    "--journal-key as its anchor: the checkpoint is verified with the key it gives.",
)
@click.pass_obj
def proof_verify(ctx: Ctx, file: str, vkey: str, history_file: str | None) -> None:
    """Verify a tlog-proof offline (no database): the checkpoint's signature and the
    entry's inclusion; exit 3 if either fails."""
    NoteKey.given(vkey)  # bad input before anything else
    made = InclusionText.parse(read_text(file))
    checkpoint_ = made.verify(key_for(vkey, history_file, made.note, "--journal-key"))
    ctx.emit(
        {"ok": True, "index": made.index, "size": checkpoint_.size},
        f"ok: entry {made.index} is in the tree of {checkpoint_.size} entries",
    )
