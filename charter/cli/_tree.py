"""``charter proof inclusion`` and ``consistency``: proofs from the journal's Merkle
tree, which they bring up to the journal's head (and inclusion signs a checkpoint with
the home's journal key). A SQLite journal is opened by the ledger
(:func:`~charter.audit.tree.ledger_journal`), not charter.app: they load no
PostgreSQL driver and none of the app; a PostgreSQL one is opened by the app, with its
settings. Also the journal's signing keys in the home, for ``audit.py``'s signers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click
from nacl.signing import SigningKey

from charter.audit.errors import NotInTreeError
from charter.audit.keys import JOURNAL_KEY, is_retired
from charter.audit.proofs import ConsistencyText
from charter.audit.tree import MerkleLog, ledger_journal
from charter.cli._common import AsciiIntRange, Ctx
from charter.core.errors import CharterError, StateError
from charter.core.home import KeyStore, charter_home

if TYPE_CHECKING:
    from charter.audit.tree import JournalReader

__all__ = [
    "journal_key_names",
    "journal_keys",
    "open_ledger",
    "opened",
    "proof_consistency",
    "proof_inclusion",
]


def open_ledger(ctx: Ctx, *, read_only: bool = False) -> JournalReader | None:
    """The journal at --db (or the home's) opened by the ledger when the app's settings
    are not needed (:func:`~charter.audit.tree.ledger_journal`), else None."""
    try:
        return ledger_journal(ctx.db, read_only=read_only)
    except CharterError:
        ctx.refuse_missing_journal()  # the home's own journal moved: that advice first
        raise


@contextmanager
def opened(ctx: Ctx) -> Iterator[tuple[JournalReader, KeyStore]]:
    """The journal, to write its tree, and the home's keys: by the ledger on SQLite,
    through charter.app on PostgreSQL."""
    journal = open_ledger(ctx)
    if journal is None:
        with ctx.open_charter() as charter:
            yield charter.journal, charter.keys
        return
    with journal:
        yield journal, KeyStore(charter_home())


def journal_key_names(keys: KeyStore) -> list[str]:
    """``journal``, then each rotated one (``journal.1``, ``journal.2``, …)."""
    names = [JOURNAL_KEY]
    while keys.exists(f"{JOURNAL_KEY}.{len(names)}"):
        names.append(f"{JOURNAL_KEY}.{len(names)}")
    return names


def journal_keys(keys: KeyStore) -> list[SigningKey]:
    """The journal's signing keys in the home that are not retired (a rotation destroys
    the key it rotates away from); the tree picks the one a checkpoint needs."""
    names = [n for n in journal_key_names(keys) if not is_retired(keys, n)]
    if not names:
        raise StateError(f"the Charter home {keys.home} holds no journal key that may sign")
    return [keys.load(n) for n in names]


@click.command("inclusion")
@click.argument("position", type=AsciiIntRange(min=1))
@click.option("--size", type=AsciiIntRange(min=1), help="Tree size (default: the whole tree).")
@click.pass_obj
def proof_inclusion(ctx: Ctx, position: int, size: int | None) -> None:
    """A C2SP tlog-proof that the entry at POSITION is in the tree, with the entry's
    frame and a signed checkpoint of that tree."""
    with opened(ctx) as (journal, keys):
        log = MerkleLog(journal)
        made = log.tlog_proof(position, journal_keys(keys), size)
        detail = log.inclusion(position, size)
    text = made.render()
    ctx.emit({**detail.to_json(), "text": text}, lambda: click.echo(text, nl=False))


@click.command("consistency")
@click.argument("old", type=AsciiIntRange(min=0))
@click.argument("new", type=AsciiIntRange(min=0))
@click.pass_obj
def proof_consistency(ctx: Ctx, old: int, new: int) -> None:
    """The RFC 6962 consistency proof from tree size OLD to NEW."""
    if old > new:
        raise NotInTreeError(f"OLD ({old}) is larger than NEW ({new})")
    with opened(ctx) as (journal, _):
        log = MerkleLog(journal)
        log.catch_up()
        made = log.consistency(old, new)
    text = ConsistencyText(old=old, new=new, path=made.path).render()
    ctx.emit({**made.to_json(), "text": text}, lambda: click.echo(text, nl=False))
