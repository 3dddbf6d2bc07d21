"""The demo's worker program, and the same scan without Charter.

Standard library only: the cell runs this file's source with ``/usr/bin/python3 -I -c``
inside each worker's sandbox, where it reaches Charter through the door client
(``/workspace/charter_door.py``). On the host, :func:`scan` and :func:`report` are the
same scan run directly, which is what the demo's merged report is compared with.

Modes (argv after the source):

* ``coordinate N``: list the Python standard library's sources, cut them into N
  shards, fan out one reviewer per shard, wait, merge their findings;
* ``review START END SPLIT``: review files START..END of that list; a shard bigger than
  ``BIG_SHARD_BYTES`` with SPLIT=1 fans out once more into two halves and merges them.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
import sys
from typing import Any

__all__ = ["BIG_SHARD_BYTES", "PATTERNS", "files", "main", "report", "scan", "shards"]

PATTERNS = ("eval(", "pickle.loads", "shell=True", "os.system(")
ROOTS = "/usr/lib/python3.[0-9]*"
BIG_SHARD_BYTES = 1_500_000
PY = "/usr/bin/python3"
_MINUTE = 60_000


def files() -> list[str]:
    """Every ``.py`` file of the standard library's sources, sorted. Symbolic links are
    left out: they point outside (``sitecustomize.py`` into ``/etc``), where a sandbox
    and the host see different things."""
    found = set()
    for root in glob.glob(ROOTS):
        found.update(glob.glob(os.path.join(root, "**", "*.py"), recursive=True))
    return sorted(p for p in found if not os.path.islink(p))


def scan(paths: list[str]) -> list[list[Any]]:
    """``[path, line number, pattern]`` for every risky call in ``paths``."""
    findings: list[list[Any]] = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            findings.extend([path, number, p] for p in PATTERNS if p in line)
    return findings


def report(scanned: int, findings: list[list[Any]]) -> dict[str, Any]:
    """The report: files scanned, counts per pattern, every finding in order."""
    ordered = sorted(findings)
    counts = {p: sum(1 for f in ordered if f[2] == p) for p in PATTERNS}
    return {"files": scanned, "counts": counts, "findings": ordered}


def shards(total: int, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous ranges covering ``0..total`` (the first ones one longer)."""
    size, extra = divmod(total, n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        if end > start:
            out.append((start, end))
        start = end
    return out


def _cost(width: int, tokens: int, minutes: int, mem_mib: int) -> dict[str, int]:
    return {
        "tokens": tokens * width,
        "wall_ms": minutes * _MINUTE * width,
        "cpu_ms": minutes * _MINUTE * width,
        "mem_bytes": mem_mib * 2**20 * width,
        "egress_bytes": 0,
    }


def _fan_out(door: Any, ranges: list[tuple[int, int]], split: int, objective: str) -> Any:
    with open("/proc/self/cmdline", "rb") as f:  # this program's own source (after -c)
        source = f.read().split(b"\0")[3].decode()
    width = len(ranges)
    workers = [
        {"argv": [PY, "-I", "-c", source, "review"], "inputs": [str(a), str(b), str(split)]}
        for a, b in ranges
    ]
    intent = {
        "width": width,
        "objective": objective,
        # Each split-capable reviewer holds enough that a split of two costs under half
        # of it (the gate refuses a bet of more than half an actor's ceiling).
        "estimated_cost": (
            _cost(width, 100_000, 10, 1024) if split else _cost(width, 20_000, 2, 128)
        ),
        "grant": {"fanout": 2 if split else 0, "depth": 1 if split else 0},
    }
    children = door.spawn(intent, workers)["children"]
    answers = door.wait(children, 1800)["children"]
    merged: list[list[Any]] = []
    scanned = 0
    for child in children:
        answer = answers[child]
        if answer["status"] != "exited" or answer["exit_code"] != 0 or not answer["result"]:
            raise SystemExit(f"{child} ended {answer['status']}: {answer.get('reason')}")
        part = json.loads(answer["result"])
        scanned += part["files"]
        merged.extend(part["findings"])
    return scanned, merged


def main(argv: list[str]) -> None:
    # The door's client exists only inside a worker's sandbox (/workspace).
    door = importlib.import_module("charter_door").Door()
    paths = files()
    if argv[0] == "coordinate":
        ranges = shards(len(paths), int(argv[1]))
        scanned, found = _fan_out(
            door, ranges, 1, "review a shard of the standard library for risky calls"
        )
        door.result(json.dumps(report(scanned, found)))
        return
    start, end, split = int(argv[1]), int(argv[2]), int(argv[3])
    part = paths[start:end]
    size = sum(os.path.getsize(p) for p in part)
    if split and size > BIG_SHARD_BYTES and len(part) > 1:
        middle = start + len(part) // 2
        scanned, found = _fan_out(
            door, [(start, middle), (middle, end)], 0, "review half of a big shard for risky calls"
        )
    else:
        scanned, found = len(part), scan(part)
    door.result(json.dumps({"files": scanned, "findings": found}))


if __name__ == "__main__":
    sys.path.insert(0, "/workspace")
    main(sys.argv[1:])
