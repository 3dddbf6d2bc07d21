"""Issue 23 point 6: worker-controlled text reaches a terminal only through
``printable``; control characters (C0, DEL, C1, escape sequences, bidi overrides) are
shown as escapes, while ``--json`` keeps the exact text."""

from __future__ import annotations

import io
import json
import unicodedata
from pathlib import Path

import click
import pytest
from rich.console import Console

from charter.audit.chain import ChainReport
from charter.cli import demo as demo_cli
from charter.cli._common import Ctx, run_guarded
from charter.cli._render import brief_payload, printable, render_budgets, render_slots, render_tree
from charter.core import Budget, StateError
from charter.ledger import Journal
from charter.projections import BudgetReport, SlotsReport, TreeReport
from charter.projections._answers import BudgetLine, CellSlots, TreeNode
from charter.runner.demo import DemoOutcome
from charter.runner.events import WorkerResult
from charter.runner.status import Row
from tests.cli._run import charter

TITLE = "\x1b]0;pwned\x07"  # sets the terminal's title
CLEAR = "\x1b[2J\x1b[H"  # clears the screen
COLOUR = "\x1b[31m"
C1_CSI = "\x9b2J"  # the one-character CSI
BIDI = "\u202eevil\u202c \u2066iso\u2069 \u200f"
OTHER = "a\rb\x08c\x00d\x7fe\nf\tg\u2028h\x1bc"
HOSTILE = TITLE + CLEAR + COLOUR + "red" + C1_CSI + BIDI + OTHER
BENIGN = "Prüfung 日本語 ✓ sa-10 [active] C:\\path ‘quoted’ 👩‍💻"

_BIDI = {0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}


def _unsafe(text: str) -> list[str]:
    """The characters of ``text`` a terminal would act on (a line's own end aside)."""
    return [
        c
        for line in text.split("\n")
        for c in line
        if unicodedata.category(c) == "Cc" or ord(c) in _BIDI
    ]


def test_printable_escapes_every_control_character() -> None:
    shown = printable(HOSTILE)
    assert _unsafe(shown) == []
    assert "\n" not in shown
    for escape in ("\\x1b]0;pwned\\x07", "\\x1b[2J", "\\x9b2J", "\\u202e", "\\u2066", "\\x7f"):
        assert escape in shown  # shown, not dropped: a reader sees what was sent
    for ch in ("\r", "\x08", "\x00", "\t", "\u2028"):
        assert f"\\x{ord(ch):02x}" in shown or f"\\u{ord(ch):04x}" in shown
    assert _unsafe(HOSTILE)  # control: the test's own detector sees the raw text


def test_printable_leaves_ordinary_text_alone() -> None:
    assert printable(BENIGN) == BENIGN  # non-ASCII letters, emoji (with ZWJ), brackets
    short = "Prüfung 日本語 ✓ [active] 👩\u200d💻"
    assert brief_payload({"text": short}) == f"text={short}"


def test_brief_payload_escapes_nested_and_shortened_values() -> None:
    line = brief_payload({"text": HOSTILE, "nested": json.dumps({"k": TITLE})})
    assert _unsafe(line) == []
    assert "\\x1b]0;pwned" in line


def _rendered(render: object, report: object) -> str:
    out = io.StringIO()
    render(report, Console(file=out, width=200, color_system=None))  # type: ignore[operator]
    return out.getvalue()


def test_tree_budgets_and_slots_escape_what_they_render() -> None:
    b = Budget.parse("tokens=1k,wall=1m,cpu=1m,mem=1MiB,egress=0")
    tree = TreeReport(
        as_of=3,
        nodes=(
            TreeNode(
                lineage="agent:" + HOSTILE, parent=None, depth=0, kind="agent",
                position=1, fanout=None, status="active", worker=CLEAR + "[bold]x",
            ),
        ),
    )  # fmt: skip
    budgets = BudgetReport(
        as_of=3,
        at_ms=0,
        ledgers=(
            BudgetLine(
                lineage=TITLE + "agent:x", parent=None, status=COLOUR + "active",
                allocation=b, spent=b, subtree_spent=b, outstanding=b, remaining=b,
                expires_at_ms=None, released_at_ms=None, exhausted=False, since=1,
            ),
        ),
    )  # fmt: skip
    slots = SlotsReport(
        as_of=3,
        cells=(
            CellSlots(
                cell=BIDI, caps={"cpu": 2}, cores=2, failover_reserve=0, since=1,
                holders={"cpu": (TITLE,)}, queued={"cpu": (C1_CSI,)},
            ),
        ),
    )  # fmt: skip
    for render, report, visible in (
        (render_tree, tree, "\\x1b]0;pwned"),
        (render_budgets, budgets, "\\x1b]0;pwned"),
        (render_slots, slots, "\\u202eevil"),
    ):
        text = _rendered(render, report)
        assert _unsafe(text) == [], (render, text)
        assert visible in text  # escaped and shown, not lost
    assert "[bold]x" in _rendered(render_tree, tree)  # not read as rich markup


def test_journal_show_escapes_a_workers_text_and_json_stays_exact(home: Path) -> None:
    with Journal.open(f"sqlite:///{home / 'journal.db'}") as journal:
        journal.append(
            [WorkerResult(lineage="agent:root/sa-1", digest="0" * 64, size=3, text=HOSTILE)]
        )
    human = charter("journal", "show", "--type", "WorkerResult", home=home)
    assert human.returncode == 0, human.stderr
    assert _unsafe(human.stdout) == [], human.stdout
    assert "\\x1b]0;pwned" in human.stdout  # the escape is shown
    full = charter("journal", "show", "--full", "--type", "WorkerResult", home=home)
    assert _unsafe(full.stdout) == []
    exact = charter("--json", "journal", "show", "--type", "WorkerResult", home=home)
    assert json.loads(exact.stdout)["payload"]["text"] == HOSTILE  # --json: exactly


def test_messages_keep_their_lines_and_escape_the_rest() -> None:
    assert printable("two\nlines", lines=True) == "two\nlines"  # control: lines kept
    assert printable("two\nlines") == "two\\x0alines"
    shown = printable(HOSTILE, lines=True)
    assert _unsafe(shown) == []
    assert shown.count("\n") == HOSTILE.count("\n")


@pytest.mark.parametrize("error", [StateError("moved: " + TITLE), RuntimeError(CLEAR)])
def test_an_error_quoting_worker_text_is_escaped(
    error: Exception, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail() -> None:
        raise error

    with pytest.raises(SystemExit):
        run_guarded(click.Command("x", callback=fail), [])
    said = capsys.readouterr().err
    assert said.startswith(("charter: error: moved: \\x1b]0;pwned", "charter: internal error"))
    assert _unsafe(said) == [], said
    assert "\\x1b[2J" in said or "\\x1b]0;pwned" in said  # shown, not dropped


def test_status_and_text_output_are_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    ctx = Ctx(db=None, as_json=False, quiet=False)
    ctx.status("started " + TITLE)
    ctx.emit({"x": TITLE}, "line one\n" + CLEAR + "line two")
    captured = capsys.readouterr()
    assert _unsafe(captured.err) == []
    assert _unsafe(captured.out) == []
    assert captured.out.count("\n") == 2  # its own lines kept
    ctx = Ctx(db=None, as_json=True, quiet=False)
    ctx.emit({"x": TITLE}, "unused")
    assert json.loads(capsys.readouterr().out) == {"x": TITLE}  # --json: exact


def _demo_outcome(text: str) -> DemoOutcome:
    """A demo's outcome whose report (the coordinator worker's answer) and tree rows
    carry ``text``."""
    return DemoOutcome(
        home=Path("/nowhere"),
        journal="sqlite:///nowhere",
        report={"files": 3, "counts": {text: 1}, "findings": [[f"/lib/{text}.py", 7, text]]},
        totals={"workers": 1, "cpu_ms": 0, "wall_ms": 0, "memory_peak_bytes": 0,
                "egress_bytes": 0},
        verified=ChainReport(ok=True, checked=1, head=None),
        rows=(Row(lineage="agent:demo/" + text, depth=1, status="exited", burn=CLEAR + "[b]1"),),
    )  # fmt: skip


def test_the_demos_report_and_tree_escape_a_workers_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The coordinator is a worker: its answer is the report, its children the tree.
    outcome = _demo_outcome(HOSTILE)
    demo_cli._text(outcome)
    said = capsys.readouterr().out
    assert _unsafe(said) == [], said
    assert "\\x1b]0;pwned" in said  # shown, not dropped
    tree = io.StringIO()
    Console(file=tree, width=400, color_system=None).print(demo_cli._tree(list(outcome.rows)))
    assert _unsafe(tree.getvalue()) == [], tree.getvalue()
    assert "\\x1b]0;pwned" in tree.getvalue()
    assert "[b]1" in tree.getvalue()  # not read as rich markup
    # Control: ordinary text is shown as it is, the very characters.
    demo_cli._text(_demo_outcome(BENIGN))
    plain = capsys.readouterr().out
    assert f"/lib/{BENIGN}.py:7: {BENIGN}" in plain
