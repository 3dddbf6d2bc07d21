"""Output for people: compact tables that fit 80 columns, natural order (sa-2 before
sa-10), and journal payloads decoded and shortened. ``--json`` never comes here.

Text a worker (or whoever wrote the journal) controls reaches a terminal only through
:func:`printable`, which shows control characters as escapes instead of sending them.
rich and the projections are imported when a rendering runs, not with this module.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # imported when a rendering runs: `charter tree --help` loads neither
    from rich.console import Console
    from rich.table import Table

    from charter.core import Budget
    from charter.projections import BudgetReport, SlotsReport, TreeReport

__all__ = [
    "brief_payload",
    "progress_bar",
    "decode_nested",
    "natural_key",
    "printable",
    "render_budgets",
    "render_slots",
    "render_tree",
    "rich_safe",
    "select",
    "short_budget",
]

T = TypeVar("T")

# What a terminal may act on instead of showing: C0 controls (ESC starts the title,
# screen-clearing and colour sequences; CR and BS overwrite what is shown), DEL, C1
# controls (U+009B is a one-character CSI), the line and paragraph separators, and
# the bidirectional overrides, embeddings, isolates and marks that reorder a line.
_CONTROL = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _escape_one(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``,
    ``\\u202e``), so that text from the journal cannot set a terminal's title, clear
    its screen, colour it, rewrite a line or reorder it. Everything else, non-ASCII
    letters included, is unchanged; with ``lines``, so are line feeds (a message of
    several lines). The one function for text to people; ``--json`` stays exact and
    never comes here."""
    if lines:
        return "\n".join(_CONTROL.sub(_escape_one, line) for line in text.split("\n"))
    return _CONTROL.sub(_escape_one, text)


def rich_safe(text: str) -> str:
    """Worker-controlled text for rich: control characters escaped, and ``[`` not
    read as rich markup."""
    from rich.markup import escape

    return escape(printable(text))


_DIGITS = re.compile(r"(\d+)")


def natural_key(lineage: str) -> tuple[tuple[tuple[int, int | str], ...], ...]:
    """Sort key: numbers inside a segment compare as numbers (``sa-2`` before
    ``sa-10``), and a lineage sorts before every lineage below it."""
    return tuple(
        tuple((0, int(part)) if part.isdigit() else (1, part) for part in _DIGITS.split(seg))
        for seg in lineage.split("/")
    )


def select(
    items: Iterable[T],
    lineage_of: Callable[[T], str],
    status_of: Callable[[T], str],
    *,
    statuses: tuple[str, ...],
    limit: int | None,
) -> tuple[list[T], int]:
    """``items`` in natural order, only those of ``statuses`` (all when empty), at most
    ``limit`` of them (all when None); also how many were left out by the limit."""
    kept = sorted(
        (item for item in items if not statuses or status_of(item) in statuses),
        key=lambda item: natural_key(lineage_of(item)),
    )
    if limit is None or len(kept) <= limit:
        return kept, 0
    return kept[:limit], len(kept) - limit


# -- amounts -------------------------------------------------------------------------


def _amount(value: float, units: tuple[tuple[float, str], ...]) -> str:
    """``value`` in the largest unit it reaches, three significant digits at most (a
    value that rounds up to the next unit is shown in that unit: 1M, not 1e+03k)."""
    i = next((i for i, (size, _) in enumerate(units) if value >= size), None)
    if i is None:
        return f"{value:g}{units[-1][1]}"
    if i > 0 and float(f"{value / units[i][0]:.3g}") >= units[i - 1][0] / units[i][0]:
        i -= 1
    size, unit = units[i]
    if i == 0 and value / size >= 1000:  # beyond the largest unit: no exponent
        return f"{value / size:.0f}{unit}"
    return f"{float(f'{value / size:.3g}'):g}{unit}"


_TOKENS = ((1e6, "M"), (1e3, "k"), (1, ""))
_TIME = ((3_600_000, "h"), (60_000, "m"), (1_000, "s"), (1, "ms"))
_BYTES = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def _axes(b: Budget) -> tuple[str, str, str, str, str]:
    return (
        _amount(b.tokens, _TOKENS),
        _amount(b.wall_ms, _TIME),
        _amount(b.cpu_ms, _TIME),
        _amount(b.mem_bytes, _BYTES),
        _amount(b.egress_bytes, _BYTES),
    )


def short_budget(b: Budget) -> str:
    """A budget in the CLI's own syntax, rounded for people (``--json`` is exact)."""
    names = ("tokens", "wall", "cpu", "mem", "egress")
    return ",".join(f"{name}={value}" for name, value in zip(names, _axes(b), strict=True))


def _ms(value: int) -> str:
    return datetime.fromtimestamp(value / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _until(expires_at_ms: int | None, now_ms: int) -> str:
    """An expiry relative to the answer's time: ``in 9m``, ``2h ago``, ``-`` for none."""
    if expires_at_ms is None:
        return "-"
    delta = expires_at_ms - now_ms
    span = _amount(abs(delta), ((86_400_000 * 365, "y"), (86_400_000, "d"), *_TIME[:3]))
    return f"in {span}" if delta >= 0 else f"{span} ago"


# -- tables --------------------------------------------------------------------------


def _table(title: str) -> Table:
    from rich import box
    from rich.table import Table

    # one space between columns and none at the edges: a ledger fits 80 columns
    return Table(
        title=title,
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
        title_justify="left",
    )


def render_budgets(report: BudgetReport, console: Console) -> None:
    """One line a ledger: what remains on each axis, and when the lease ends."""
    table = _table(f"remaining budget as of position {report.as_of} ({_ms(report.at_ms)})")
    # the lineage gives way first when the terminal is narrow (it ends in "…")
    table.add_column("lineage", no_wrap=True, overflow="ellipsis")
    table.add_column("status", no_wrap=True)
    for axis in ("tokens", "wall", "cpu", "mem", "egress"):
        table.add_column(axis, justify="right", no_wrap=True)
    table.add_column("expires", no_wrap=True)
    for line in report.ledgers:
        status = "exhausted" if line.exhausted and line.status == "active" else line.status
        table.add_row(
            rich_safe(line.lineage),
            rich_safe(status),
            *_axes(line.remaining),
            _until(line.expires_at_ms, report.at_ms),
        )
    console.print(table)


def render_tree(report: TreeReport, console: Console) -> None:
    from rich.tree import Tree

    top = Tree(f"lineage as of position {report.as_of}")
    branches: dict[str, Tree] = {}
    for node in report.nodes:  # natural order: a parent comes before its children
        # escaped: "[active]" would otherwise be read as rich markup and vanish
        # the lease's status, then (for a scheduled worker) the worker's own
        status = rich_safe(f"[{node.status}]") + (
            f" {rich_safe(node.worker)}" if node.worker else ""
        )
        parent = branches.get(node.parent) if node.parent else None
        name = node.lineage.rsplit("/", 1)[-1] if parent is not None else node.lineage
        spent = f" {node.tokens_spent} tokens" if node.tokens_spent else ""
        if node.worker is not None and node.burn is not None:  # a worker's CPU and wall
            b = node.burn
            live = " so far" if b.source == "sampled" else ""
            spent += f" cpu {b.cpu_ms / 1000:.2f}s wall {b.wall_ms / 1000:.1f}s{live}"
        label = f"{rich_safe(name)}  {status}{spent} @{node.position}"
        branches[node.lineage] = (parent or top).add(label)
    console.print(top)


def render_slots(report: SlotsReport, console: Console) -> None:
    table = _table(f"slots as of position {report.as_of}")
    for column in ("cell", "class", "occupancy", "cap", "holders", "queued"):
        table.add_column(column, no_wrap=column not in ("holders", "queued"))

    def first(lineages: list[str]) -> str:
        return ", ".join(lineages[:3]) + (f" (+{len(lineages) - 3})" if len(lineages) > 3 else "")

    for cell in report.cells:
        for resource, info in cell.to_json()["slots"].items():
            holders = sorted(info["holders"], key=natural_key)
            queued = list(info.get("queued", ()))  # in admission order, not sorted
            table.add_row(
                rich_safe(cell.cell),
                rich_safe(resource),
                str(info["occupancy"]),
                str(info["cap"]),
                rich_safe(first(holders)),
                rich_safe(first(queued)),
            )
    console.print(table)


# -- journal payloads ----------------------------------------------------------------

_HEX = re.compile(r"^[0-9a-f]{16,}$")  # hashes, keys, signatures, fan-out ids
_LONG = 40
_ITEMS = 3
_DEPTH = 2  # mappings nested deeper are shown as {…N}
_LINE = 120  # payload characters a line shows without --full


def decode_nested(value: Any) -> Any:
    """``value`` with every string that holds a JSON object or array decoded (a grant's
    signed body is JSON inside the payload's JSON)."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return decode_nested(json.loads(value))
        except ValueError:
            return value
    if isinstance(value, Mapping):
        return {k: decode_nested(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [decode_nested(v) for v in value]
    return value


def _brief(value: Any, depth: int = 0) -> str:
    from charter.core import Budget

    if isinstance(value, Mapping):
        if set(value) == set(Budget.AXES):
            try:
                return short_budget(Budget.model_validate(value))
            except ValueError:  # not a valid budget after all: shown as it is
                pass
        if depth >= _DEPTH:
            return f"{{…{len(value)}}}"
        return "{" + " ".join(f"{k}={_brief(v, depth + 1)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        shown = [_brief(v, depth + 1) for v in value[:_ITEMS]]
        if len(value) > _ITEMS:
            shown.append(f"…+{len(value) - _ITEMS}")
        return "[" + ",".join(shown) + "]"
    if isinstance(value, str):
        return _brief_text(value)
    return json.dumps(value)


def _brief_text(value: str) -> str:
    if _HEX.fullmatch(value):
        return value[:12] + "…"
    return value if len(value) <= _LONG else value[: _LONG - 1] + "…"


def brief_payload(payload: Mapping[str, Any]) -> str:
    """A payload as ``key=value`` pairs, nested JSON decoded, long values shortened,
    at most ``_LINE`` characters (``journal show --full`` shows everything), control
    characters escaped (:func:`printable`)."""
    decoded = decode_nested(payload)
    text = " ".join(f"{k}={_brief(v, 1)}" for k, v in sorted(decoded.items()))
    text = text if len(text) <= _LINE else text[: _LINE - 1] + "…"
    return printable(text)


@contextmanager
def progress_bar(quiet: bool, label: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr, fed ``(done, total)``; None when ``quiet`` (--quiet or
    --json) or stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task(label, total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)
