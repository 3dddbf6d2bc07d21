"""The fault groups of charter.core.errors: how refusal classes are declared, where each
package defines its errors, and what each group becomes at the real CLI."""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys
import types
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import charter
from charter.core import (
    BadInputError,
    Budget,
    CharterError,
    KeyPermissionsError,
    KeyStore,
    RefusedError,
    StateError,
)
from charter.sandbox import (
    FIRST_SANDBOX_UID,
    HostFacts,
    HostFactsError,
    KeyBroker,
    KeySeedError,
    PoolCapacityError,
    SandboxUnavailableError,
    SignatureTagError,
    WarmPool,
)

ROOT = Path(__file__).resolve().parents[2]
BUDGET = Budget.parse("tokens=0,wall=5s,cpu=5s,mem=64MiB,egress=0")


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _import_all_of_charter() -> None:
    """Import every module under charter (not ``__main__``, which would run the CLI)."""
    for info in pkgutil.walk_packages(charter.__path__, "charter."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def _charter_errors() -> set[type[CharterError]]:
    _import_all_of_charter()
    return {c for c in _subclasses(CharterError) if c.__module__.startswith("charter.")}


def _reason() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


# -- declaring refusals ------------------------------------------------------------------


def refusal(name: str, reason: str | None = None, *, base: type = RefusedError, **kw: bool) -> type:
    """Define a refusal class (as a ``class`` statement would, keywords included)."""

    def body(ns: dict[str, object]) -> None:
        ns["__module__"] = __name__
        if reason is not None:
            ns["reason"] = reason

    return types.new_class(name, (base,), kw, body)


@pytest.mark.parametrize("reason", [None, "", "refused"])
def test_a_refusal_class_without_its_own_reason_is_refused_at_definition(
    reason: str | None,
) -> None:
    with pytest.raises(TypeError, match="reason"):
        refusal("NoReasonError", reason)


def test_inheriting_a_reason_is_not_declaring_one() -> None:
    parent = refusal("HasReasonError", _reason())
    with pytest.raises(TypeError, match="reason"):
        refusal("InheritsReasonError", base=parent)


def test_a_class_statement_declaring_a_reason_is_accepted() -> None:
    code = _reason()

    class DeclaredError(RefusedError):
        reason = code

    with pytest.raises(RefusedError) as err:
        raise DeclaredError("no")
    assert err.value.reason == code
    assert RefusedError._reasons[code] is DeclaredError


def test_an_abstract_group_is_allowed_but_cannot_be_raised() -> None:
    class TestGroupError(RefusedError, abstract=True):
        pass

    with pytest.raises(TypeError, match="group"):
        TestGroupError("refused as a group")

    # Control: a member of the group, with its own reason, can be raised.
    code = _reason()
    member = refusal("MemberError", code, base=TestGroupError)("refused")
    assert isinstance(member, TestGroupError)
    assert member.reason == code


def test_the_base_refusal_is_itself_a_group() -> None:
    with pytest.raises(TypeError):
        RefusedError("which refusal?")


def test_two_refusal_classes_cannot_share_a_reason_code() -> None:
    code = _reason()

    first = refusal("FirstError", code)
    with pytest.raises(TypeError, match="share"):
        refusal("SecondError", code)
    # Nor may a new class reuse a code Charter already journals.
    with pytest.raises(TypeError, match="share"):
        refusal("ImpostorError", "pool-exhausted")
    assert RefusedError._reasons[code] is first
    assert RefusedError._reasons["pool-exhausted"].__module__ == "charter.sandbox.errors"


def test_every_concrete_refusal_in_charter_has_a_unique_reason() -> None:
    importlib.import_module("charter.catalogue")
    refusals = [c for c in _subclasses(RefusedError) if c.__module__.startswith("charter.")]
    concrete = [c for c in refusals if not c._abstract]
    assert len(concrete) >= 10  # the walk found Charter's refusals
    seen: dict[str, type] = {}
    for cls in concrete:
        reason = cls.__dict__.get("reason")
        assert isinstance(reason, str), cls
        assert reason, cls
        assert reason != "refused", cls
        assert re.fullmatch(r"[a-z][a-z0-9-]*", reason), (cls, reason)
        assert reason not in seen, (cls, seen.get(reason))
        seen[reason] = cls
        assert RefusedError._reasons[reason] is cls
    # The groups: never raised themselves.
    for group in (c for c in refusals if c._abstract):
        with pytest.raises(TypeError):
            group("a group")


# -- one errors module per package -------------------------------------------------------

PACKAGES = [
    "charter.core",
    "charter.ledger",
    "charter.authority",
    "charter.budgets",
    "charter.sandbox",
    "charter.supervision",
    "charter.projections",
    "charter.audit",
]


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_defines_its_errors_in_its_errors_module(package: str) -> None:
    importlib.import_module(f"{package}.errors")
    errors = _charter_errors()
    mine = [c for c in errors if c.__module__ == package or c.__module__.startswith(package + ".")]
    assert mine, package  # the walk found this package's errors
    misplaced = sorted(
        f"{c.__module__}.{c.__qualname__}" for c in mine if c.__module__ != f"{package}.errors"
    )
    assert misplaced == []


def test_no_error_is_defined_outside_an_errors_module() -> None:
    """Packages with no errors module (control, app, cli, …) define no errors at all."""
    misplaced = sorted(
        f"{c.__module__}.{c.__qualname__}"
        for c in _charter_errors()
        if c.__module__.rpartition(".")[2] != "errors"
    )
    assert misplaced == []


# -- exit codes through the real CLI -----------------------------------------------------


def charter_cli(
    *args: str, home: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CHARTER_DB", "CHARTER_DEBUG")}
    return subprocess.run(
        [sys.executable, "-m", "charter", *args],
        capture_output=True,
        text=True,
        cwd=home.parent,
        env={**base, "CHARTER_HOME": str(home), "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=120,
        check=False,
    )


def _one_charter_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("charter: "), result.stderr
    return lines[0]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'journal.db'}"


BAD_BUDGET = "tokens=lots,wall=10m,cpu=60s,mem=512MiB,egress=20MB"
GOOD_BUDGET = "tokens=1M,wall=1h,cpu=1h,mem=1GiB,egress=1GB"


def test_a_malformed_budget_on_init_exits_2(home: Path, db: str) -> None:
    result = charter_cli("--db", db, "init", "--budget", BAD_BUDGET, home=home)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "budget axis 'tokens'" in result.stderr
    assert not home.exists()  # nothing was made
    # Control: the same command with a well-formed budget succeeds.
    ok = charter_cli("--db", db, "init", "--budget", GOOD_BUDGET, home=home)
    assert ok.returncode == 0, ok.stderr


def test_a_malformed_budget_on_spawn_exits_2(home: Path, db: str) -> None:
    assert charter_cli("--db", db, "init", "--budget", GOOD_BUDGET, home=home).returncode == 0
    spawn = ("spawn", "--parent", "agent:root", "--width", "1", "--objective", "scan the hosts")
    result = charter_cli("--db", db, *spawn, "--est-cost", BAD_BUDGET, home=home)
    assert result.returncode == 2, result.stderr
    assert "budget axis 'tokens'" in _one_charter_line(result)


def test_an_unknown_url_scheme_exits_2(home: Path) -> None:
    result = charter_cli("--db", "mysql://root@localhost/charter", "tree", home=home)
    assert result.returncode == 2, result.stderr
    assert "unknown journal URL scheme" in _one_charter_line(result)
    # The same through CHARTER_DB.
    result = charter_cli("init", home=home, env={"CHARTER_DB": "ftp://example.org/j"})
    assert result.returncode == 2, result.stderr
    assert "unknown journal URL scheme" in _one_charter_line(result)


def test_tree_without_a_journal_exits_1(home: Path, db: str) -> None:
    result = charter_cli("--db", db, "tree", home=home)
    assert result.returncode == 1, result.stderr
    assert "charter init" in _one_charter_line(result)
    # And with no --db at all: the home's default journal is not there either.
    result = charter_cli("tree", home=home)
    assert result.returncode == 1, result.stderr
    _one_charter_line(result)


def test_a_zero_wall_clock_sandbox_spec_exits_2(home: Path) -> None:
    result = charter_cli(
        "sandbox", "spec", "--budget", "tokens=0,wall=0s,cpu=1s,mem=64MiB,egress=0", home=home
    )
    assert result.returncode == 2, result.stderr
    assert "wall" in _one_charter_line(result)
    # Control: a one-second wall clock compiles.
    ok = charter_cli(
        "sandbox", "spec", "--budget", "tokens=0,wall=1s,cpu=1s,mem=64MiB,egress=0", home=home
    )
    assert ok.returncode == 0, ok.stderr


def test_a_relative_workspace_for_sandbox_spec_exits_2(home: Path) -> None:
    result = charter_cli("sandbox", "spec", "--workspace", "relative/ws", home=home)
    assert result.returncode == 2, result.stderr
    assert "must be absolute" in _one_charter_line(result)
    ok = charter_cli("sandbox", "spec", "--workspace", "/srv/ws", home=home)
    assert ok.returncode == 0, ok.stderr


def test_a_truncated_journal_exits_3_and_a_refusal_exits_4(home: Path, db: str) -> None:
    """The two remaining groups: TamperedError (3) and RefusedError (4)."""
    assert charter_cli("--db", db, "init", "--budget", GOOD_BUDGET, home=home).returncode == 0
    beyond = "9999:" + "ab" * 32
    result = charter_cli("--db", db, "journal", "verify", "--expect-head", beyond, home=home)
    assert result.returncode == 3, result.stderr
    assert "does not verify" in _one_charter_line(result)
    assert charter_cli("--db", db, "journal", "verify", home=home).returncode == 0  # control

    result = charter_cli(
        "--db", db, "spawn", "--parent", "agent:root", "--width", "1", "--objective",
        "scan host alpha for the open ports list", "--est-cost",
        "tokens=900M,wall=1m,cpu=1m,mem=1MiB,egress=0", home=home,
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert "refused (gate-negative)" in _one_charter_line(result)


def test_a_group_readable_custody_key_stops_the_cli_with_exit_1(home: Path, db: str) -> None:
    assert charter_cli("--db", db, "init", "--budget", GOOD_BUDGET, home=home).returncode == 0
    key = home / "keys" / "agent-root.key"
    spawn = (
        "spawn", "--parent", "agent:root", "--width", "1", "--objective",
        "scan host alpha for the open ports list", "--est-cost",
        "tokens=1k,wall=1m,cpu=1m,mem=1MiB,egress=0",
    )  # fmt: skip
    key.chmod(0o640)
    result = charter_cli("--db", db, *spawn, home=home)
    assert result.returncode == 1, result.stderr
    assert "chmod 600" in _one_charter_line(result)
    key.chmod(0o600)  # control: the same spawn gets past the key check
    result = charter_cli("--db", db, *spawn, home=home)
    assert "chmod 600" not in result.stderr
    assert result.returncode in (0, 4), result.stderr


# -- bad input raised in-process -----------------------------------------------------------


def test_a_pool_of_no_slots_is_bad_input_before_anything_is_touched(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-template"
    state = tmp_path / "state"
    with pytest.raises(PoolCapacityError) as err:
        WarmPool(missing, BUDGET, 0, state_dir=state, bwrap="/nonexistent/bwrap")
    assert isinstance(err.value, BadInputError)
    assert not isinstance(err.value, RefusedError)
    with pytest.raises(PoolCapacityError):
        WarmPool(missing, BUDGET, -3, state_dir=state)
    assert not state.exists()  # nothing was made on the host
    # Control: with one slot the capacity passes and the next check (the template) fails.
    with pytest.raises(SandboxUnavailableError):
        WarmPool(missing, BUDGET, 1, state_dir=state, bwrap="/nonexistent/bwrap")


@pytest.mark.parametrize("length", [0, 16, 31, 33, 64])
def test_a_seed_of_the_wrong_length_is_bad_input(length: int) -> None:
    with KeyBroker() as broker:
        with pytest.raises(KeySeedError) as err:
            broker.issue(bytearray(length))
        assert isinstance(err.value, BadInputError)
        # Control: 32 bytes make a key.
        handle = broker.issue(bytearray(32))
        assert len(broker.public_key(handle)) == 32


@pytest.mark.parametrize("tag", ["", "Upper", "has space", "-leading", "a" * 65])
def test_a_bad_signature_tag_is_bad_input(tag: str) -> None:
    with KeyBroker() as broker:
        handle = broker.issue(bytearray(range(32)))
        with pytest.raises(SignatureTagError) as err:
            broker.sign(handle, tag, b"message")
        assert isinstance(err.value, BadInputError)
        assert len(broker.sign(handle, "git/commit-" + "a" * 53, b"message")) == 64  # control


def _facts(**changes: object) -> HostFacts:
    values: dict[str, object] = {
        "sandbox_id": "t1",
        "host_uid": FIRST_SANDBOX_UID,
        "host_gid": FIRST_SANDBOX_UID,
        "workspace": "/srv/workspace",
    }
    return HostFacts(**(values | changes))


@pytest.mark.parametrize(
    "changes",
    [
        {"workspace": "relative/workspace"},
        {"workspace": "./ws"},
        {"egress_socket": "egress.sock"},
        {"key_socket": "keys.sock"},
        {"arch": "sparc64"},
    ],
)
def test_malformed_host_facts_are_bad_input(changes: dict[str, object]) -> None:
    with pytest.raises(HostFactsError) as err:
        _facts(**changes)
    assert isinstance(err.value, BadInputError)
    assert _facts().workspace == "/srv/workspace"  # control


# -- the key store ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o610, 0o601])
def test_a_key_file_others_can_touch_is_refused(tmp_path: Path, mode: int) -> None:
    store = KeyStore(tmp_path / "home")
    created = store.create("k")
    path = tmp_path / "home" / "keys" / "k.key"
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(mode)
    with pytest.raises(KeyPermissionsError) as err:
        store.load("k")
    assert isinstance(err.value, StateError)
    assert f"chmod 600 {path}" in str(err.value)
    # Control: owner-only again, it loads, and it is the key that was made.
    path.chmod(0o600)
    assert bytes(store.load("k")) == bytes(created)
    path.chmod(0o400)
    assert bytes(store.load("k")) == bytes(created)


@pytest.mark.parametrize("mode", [0o750, 0o705, 0o755])
def test_a_keys_directory_others_can_enter_is_refused(tmp_path: Path, mode: int) -> None:
    store = KeyStore(tmp_path / "home")
    created = store.create("k")
    keys = tmp_path / "home" / "keys"
    assert keys.stat().st_mode & 0o777 == 0o700
    keys.chmod(mode)
    with pytest.raises(KeyPermissionsError) as err:
        store.load("k")
    assert f"chmod 700 {keys}" in str(err.value)
    keys.chmod(0o700)  # control
    assert bytes(store.load("k")) == bytes(created)


@pytest.mark.parametrize("name", ["k\n", "k\nx", "K", ""])
def test_a_key_name_with_a_newline_or_capitals_is_bad_input(tmp_path: Path, name: str) -> None:
    with pytest.raises(BadInputError):
        KeyStore(tmp_path / "home").create(name)
    assert not (tmp_path / "home" / "keys").exists() or not list(
        (tmp_path / "home" / "keys").iterdir()
    )
