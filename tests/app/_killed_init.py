"""``python -m tests.app._killed_init STEP ARGS…``: run ``charter ARGS…`` and SIGKILL
the process right after init's step STEP (no clean-up can run). The steps are found by
wrapping what init calls, from the test side: product code carries no test hook."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import charter.app as app
from charter.cli import main
from charter.core import KeyStore
from charter.ledger import Journal, JournalCreated


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _after(call: Callable[..., Any], when: Callable[..., bool] = lambda *a, **k: True) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        if when(*args, **kwargs):
            _die()
        return result

    return wrapped


def _arm(step: str) -> None:
    match step:
        case "key":  # the journal's signing key is made
            KeyStore.create = _after(  # type: ignore[method-assign]
                KeyStore.create, lambda _keys, name, *a, **k: name == app.JOURNAL_KEY
            )
        case "schema":  # the schema and its metadata are committed
            original = Journal.create.__func__  # type: ignore[attr-defined]
            Journal.create = classmethod(_after(original))  # type: ignore[method-assign, assignment]
        case "created":  # the first entry names the key
            Journal.append = _after(  # type: ignore[method-assign]
                Journal.append,
                lambda _j, events, *a, **k: any(isinstance(e, JournalCreated) for e in events),
            )
        case "root":  # the root agent is registered
            app.register_root = _after(app.register_root)  # type: ignore[assignment]
        case "cell":  # the local cell is configured
            app.Charter.configure_cell = _after(app.Charter.configure_cell)  # type: ignore[method-assign]
        case _:
            raise SystemExit(f"unknown init step {step!r}")


if __name__ == "__main__":
    _arm(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
