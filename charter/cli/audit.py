"""The auditor's side that signs, writes the tree or reads the whole journal: the
sub-commands of ``charter checkpoint`` and ``charter proof`` that charter.cli.proofs
imports when they run, and ``charter witness``, ``export`` and ``audit``."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import click

from charter.audit.bundle import verify_bundle
from charter.audit.export import export_bundle, export_jsonl
from charter.audit.keys import (
    KEY_STREAM,
    is_retired,
    retire_key,
)
from charter.audit.note import NoteKey, SignedNote
from charter.audit.proofs import ConsistencyText
from charter.audit.rotation import rotation
from charter.audit.semantic import Finding, audit_history
from charter.audit.siem import lines as jsonl_lines
from charter.audit.tree import (
    ExtensionReport,
    MerkleLog,
    verify_extension,
)
from charter.audit.witness import Witness
from charter.cli._common import AsciiIntRange, Ctx
from charter.cli._render import printable, progress_bar
from charter.cli._tree import journal_key_names, journal_keys
from charter.cli.proofs import key_for, note_summary, read_text, write_text
from charter.core import KeyStore, charter_home
from charter.core.errors import BadInputError, CharterError, StateError

# The journal is reached through charter.app (ctx.open_charter: to write, or to sign)
# or the CLI's read-only opener (ctx.open_journal), never charter.ledger directly. The
# light commands (proof verify, checkpoint key, proof inclusion and consistency on
# SQLite) are elsewhere (proofs.py, _journal_key.py, _tree.py): they load neither the
# app nor a database driver the journal does not use (bench/audit.py --startup).

__all__ = [
    "audit_cmd",
    "checkpoint_follow",
    "checkpoint_now",
    "checkpoint_rotate",
    "checkpoint_verify",
    "export",
    "witness",
]


# -- checkpoint ------------------------------------------------------------------------


def checkpoint_now(ctx: Ctx, out: str | None) -> None:
    """``charter checkpoint`` without a sub-command (charter.cli.proofs): sign one."""
    with ctx.open_charter() as charter:
        log = MerkleLog(charter.journal)
        note = log.checkpoint(journal_keys(charter.keys))
        log.publish(note)
    text = note.render()
    write_text(out, text)
    size, root = note_summary(note)
    ctx.emit(
        {"origin": log.origin, "size": size, "root": root, "note": text},
        lambda: click.echo(text, nl=False),
    )


@click.command("follow")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.05),
    default=1.0,
    show_default=True,
    help="Seconds between published checkpoints (the bound on a commit's wait for one).",
)
@click.pass_obj
def checkpoint_follow(ctx: Ctx, interval: float) -> None:
    """Follow the journal: keep the Merkle tree current and publish a signed checkpoint
    whenever it grew, at most every --interval seconds, until Ctrl-C."""
    with ctx.open_charter() as charter:
        log = MerkleLog(charter.journal)
        ctx.status(f"following {charter.journal.location.display}; Ctrl-C to stop")
        with contextlib.suppress(KeyboardInterrupt):
            log.follow(journal_keys(charter.keys), publish_every_s=interval)
        size = log.size()
    ctx.emit({"size": size}, f"tree size {size}")


@click.command("rotate")
@click.pass_obj
def checkpoint_rotate(ctx: Ctx) -> None:
    """Rotate the journal's signing key: a new key (``journal.N`` in the home) and a
    JournalKeyRotated entry signed by the current and the new key; checkpoints past it
    are signed by the new key, and verify from the first key through the rotation."""
    with ctx.open_charter() as charter:
        journal = charter.journal
        version = journal.stream_version(KEY_STREAM)  # pinned: one rotation at a time
        log = MerkleLog(journal)
        log.catch_up()
        history = log.history()
        names = journal_key_names(charter.keys)
        held = {
            bytes(charter.keys.load(n).verify_key): n
            for n in names
            if not is_retired(charter.keys, n)
        }
        old_name = held.get(history.current)
        if old_name is None:
            raise StateError("the home does not hold the journal's current signing key")
        current = charter.keys.load(old_name)
        # The old key's last checkpoint: the tree up to the rotation, published, so what
        # it signed stays provable once it is destroyed.
        log.publish(log.checkpoint(current, catch_up=False))
        name = f"{names[0]}.{len(history.keys)}"
        new = charter.keys.create(name)
        try:
            journal.append([rotation(log.origin, current, new)], expect={KEY_STREAM: version})
        except CharterError:
            charter.keys.remove(name)  # no key without its rotation
            raise
        log.catch_up()
        key = log.note_key()
        retire_key(charter.keys, old_name)  # nothing signs with it any more
    ctx.emit({"key": key.text(), "name": name}, key.text())


def extends_checkpoint(ctx: Ctx, file: str, vkey: str | None) -> ExtensionReport:
    """Prove the journal extends the checkpoint saved in ``file`` (``checkpoint verify``
    and ``journal verify --checkpoint``); raises ConsistencyProofError if it does not."""
    note = SignedNote.parse(read_text(file))
    key = NoteKey.given(vkey) if vkey else None
    with ctx.open_charter() as charter:
        return verify_extension(charter.journal, note, key)


@click.command("verify")
@click.argument("file")
@click.option("--journal-key", "vkey", metavar="KEY", help="Verifier key (default: the journal's).")
@click.pass_obj
def checkpoint_verify(ctx: Ctx, file: str, vkey: str | None) -> None:
    """Prove the journal is a consistent extension of a checkpoint saved earlier (every
    entry re-hashed); exit 3 for a cut tail, a rewritten history or a bad signature."""
    report = extends_checkpoint(ctx, file, vkey)
    ctx.emit(
        report.to_json(),
        f"ok: the journal ({report.size} entries) extends the checkpoint of "
        f"{report.checkpoint_size} entries",
    )


# -- witness ---------------------------------------------------------------------------


def _witness() -> Witness:
    return Witness(KeyStore(charter_home()))


@click.group()
def witness() -> None:
    """A witness with its own key: cosigns only consistent extensions of a log."""


@witness.command("init")
@click.option("--name", required=True, help="The witness's key name, e.g. witness.example/w1.")
@click.pass_obj
def witness_init(ctx: Ctx, name: str) -> None:
    """Create the witness's key in the Charter home; print its verifier key."""
    key = _witness().init(name)
    ctx.emit({"key": key.text(), "name": key.name}, key.text())


@witness.command("key")
@click.pass_obj
def witness_key(ctx: Ctx) -> None:
    """Print the witness's verifier key."""
    key = _witness().verifier_key()
    ctx.emit({"key": key.text(), "name": key.name}, key.text())


@witness.command("cosign")
@click.argument("file")
@click.option("--log-key", "log_key", required=True, metavar="KEY", help="The log's verifier key.")
@click.option(
    "--proof",
    "proof_file",
    metavar="FILE",
    help="Consistency proof from the last cosigned size (default: asked of the journal).",
)
@click.option("--out", "out", metavar="FILE", help="Also save the cosigned checkpoint to FILE.")
@click.option(
    "--key-history",
    "history_file",
    metavar="FILE",
    help="The log's key history (`charter checkpoint key --history`), checked from "
    "--log-key as its anchor: the checkpoint is verified with the key it gives.",
)
@click.pass_obj
def witness_cosign(
    ctx: Ctx,
    file: str,
    log_key: str,
    proof_file: str | None,
    out: str | None,
    history_file: str | None,
) -> None:
    """Cosign a checkpoint if it extends the last one this witness cosigned for its log;
    refuse a fork or a rollback (exit 3)."""
    w = _witness()
    note = SignedNote.parse(read_text(file))
    key = key_for(log_key, history_file, note, "--log-key")
    new_size, _ = note_summary(note)
    last = w.last(key.name)
    old_size = note_summary(last)[0] if last is not None else None
    path: tuple[bytes, ...] | None = None
    if proof_file is not None:
        given = ConsistencyText.parse(read_text(proof_file))
        if (given.old, given.new) != (old_size, new_size):
            raise BadInputError(
                f"the proof is from size {given.old} to {given.new}; needed: from "
                f"{old_size} to {new_size}"
            )
        path = given.path
    elif old_size is not None and 0 < old_size < new_size:
        with ctx.open_charter() as charter:
            path = MerkleLog(charter.journal).consistency(old_size, new_size).path
    cosigned = w.cosign(note, key, path)
    text = cosigned.render()
    write_text(out, text)
    ctx.emit({"note": text, "size": new_size}, lambda: click.echo(text, nl=False))


# -- proofs ----------------------------------------------------------------------------


# -- export ----------------------------------------------------------------------------


class _ExportGroup(click.Group):
    """``charter export OUT …`` writes a bundle; ``charter export verify …`` checks one."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["write", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_ExportGroup)
def export() -> None:
    """Export bundles: `charter export OUT [--lineage L] [--from P --to Q]`, and
    `charter export verify BUNDLE --journal-key KEY` (offline)."""


@export.command("write")
@click.argument("out")
@click.option("--lineage", metavar="L", help="Only entries about L or below it.")
@click.option("--from", "start", type=AsciiIntRange(min=1), help="First position.")
@click.option("--to", "stop", type=AsciiIntRange(min=1), help="Last position.")
@click.option(
    "--checkpoint",
    "checkpoint_file",
    metavar="FILE",
    help="A saved (e.g. cosigned) checkpoint to prove against (default: a new one).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["bundle", "jsonl"]),
    default="bundle",
    show_default=True,
    help="bundle: verifiable offline; jsonl: flat decoded JSON lines for log pipelines.",
)
@click.pass_obj
def export_write(
    ctx: Ctx,
    out: str,
    lineage: str | None,
    start: int | None,
    stop: int | None,
    checkpoint_file: str | None,
    fmt: str,
) -> None:
    """Write one bundle file, streamed in leaf order: the header (selection, key
    history, checkpoint), each selected entry's stored bytes, the grant chains' and
    key rotations' entries, the hashes of the runs of leaves it omits, and the journal
    key's seal over all of it. With --format jsonl, one flat decoded record per entry
    instead (for a SIEM)."""
    if fmt == "jsonl":
        _export_jsonl(ctx, out, lineage, start, stop)
        return
    given = SignedNote.parse(read_text(checkpoint_file)) if checkpoint_file else None
    target = Path(out)
    partial = target.with_name(f".{target.name}.partial")
    try:
        with (
            ctx.open_charter() as charter,
            progress_bar(ctx.quiet or ctx.as_json, "exporting") as progress,
            partial.open("wb") as f,
        ):
            key = journal_keys(charter.keys)  # signs the checkpoint (unless given), the seal
            made = export_bundle(
                charter.journal,
                key,
                f,
                lineage=lineage,
                start=start,
                stop=stop,
                checkpoint=given,
                progress=progress,
            )
        os.replace(partial, target)  # a bundle appears whole, or not at all
    except OSError as e:
        raise BadInputError(f"cannot write {out}: {e}") from e
    finally:
        partial.unlink(missing_ok=True)
    ctx.emit(
        {
            "out": out,
            "entries": made.entries,
            "context": made.context,
            "gaps": made.gaps,
            "bytes": made.bytes,
        },
        f"wrote {out}: {made.entries} entries (+{made.context} for grant chains and keys)",
    )


def _export_jsonl(
    ctx: Ctx, out: str, lineage: str | None, start: int | None, stop: int | None
) -> None:
    count = 0
    with ctx.open_journal() as journal:
        records = export_jsonl(journal, lineage=lineage, start=start, stop=stop)
        try:
            with Path(out).open("wb") as f:
                for line in jsonl_lines(records):
                    f.write(line)
                    count += 1
        except OSError as e:
            raise BadInputError(f"cannot write {out}: {e}") from e
    ctx.emit({"out": out, "entries": count}, f"wrote {out}: {count} entries as JSON lines")


@export.command("verify")
@click.argument("bundle")
@click.option("--journal-key", "vkey", required=True, metavar="KEY", help="The log's verifier key.")
@click.option(
    "--witness-key",
    "witness_keys",
    multiple=True,
    metavar="KEY",
    help="A witness whose cosignature must be on the checkpoint (repeatable).",
)
@click.pass_obj
def export_verify(ctx: Ctx, bundle: str, vkey: str, witness_keys: tuple[str, ...]) -> None:
    """Verify a bundle offline (no database, no network, no home); exit 3 naming the
    first part that does not verify."""
    key = NoteKey.given(vkey)
    witnesses = [NoteKey.given(k, "--witness-key") for k in witness_keys]
    try:
        with (
            Path(bundle).open("rb") as f,
            progress_bar(ctx.quiet or ctx.as_json, "verifying") as progress,
        ):
            report = verify_bundle(f, key, witness_keys=witnesses, progress=progress)
    except OSError as e:
        raise BadInputError(f"cannot read {bundle}: {e}") from e
    if not report.ok:
        if not ctx.as_json:
            for finding in report.findings:
                _print_finding(finding)
        _fail(ctx, report.to_json(), len(report.findings))
    ctx.emit(
        report.to_json(),
        f"ok: {report.entries} entries (+{report.context} for {report.grant_chains} grant "
        f"chains and keys) verify against the checkpoint of {report.checkpoint_size} entries",
    )


# -- audit -----------------------------------------------------------------------------


def _print_finding(f: Finding) -> None:
    click.echo(printable(f"{f.position:>8}  {f.check:<16} {f.lineage or '-'}  {f.detail}"))


def _fail(ctx: Ctx, doc: dict[str, object], count: int) -> None:
    """The JSON document (with --json), the count on stderr, and exit 3."""
    if ctx.as_json:
        click.echo(json.dumps(doc, sort_keys=True))
    click.echo(f"charter: error: {count} audit finding(s)", err=True)
    raise click.exceptions.Exit(3)


@click.command("audit")
@click.option("--as-of", "as_of", type=AsciiIntRange(min=0), help="Audit up to this position.")
@click.pass_obj
def audit_cmd(ctx: Ctx, as_of: int | None) -> None:
    """Semantic checks over the journal (write-once trust anchors, budget conservation,
    grant chains, the gate and its width, admission caps and queue order, sandbox
    leases, workers and lifecycles, revoked subtrees, unknown entry types); exit 3 with
    the positions of any finding (docs/VERIFYING.md §9 lists every check). Findings are
    printed as they are found, one line each (with --json, one document at the end)."""
    on_finding = None if ctx.as_json else _print_finding
    with ctx.open_journal() as journal:
        report = audit_history(journal.payloads(None, as_of), on_finding)
    if not report.ok:
        _fail(ctx, report.to_json(), len(report.findings))
    ctx.emit(report.to_json(), f"ok: {report.checked} entries audited, no findings")
