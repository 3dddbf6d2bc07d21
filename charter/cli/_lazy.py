"""Help and shell completion without importing the commands.

A sub-command's module imports pydantic, the journal or the sandbox, which costs many
times an interpreter's start. ``charter X --help`` and shell completion need only the
command's shape (its options, arguments, types and help text), so ``_index.py`` holds
that shape for every command, generated from the real commands (``scripts/cli-index``
writes it), and :func:`stand_in` builds a click command from it
that parses exactly as the real one but never runs: its callback raises
:class:`StandInInvoked`, and the root group then runs the real command with the same
arguments. ``tests/cli/test_startup.py`` checks that the index is the commands' shape,
that click holds the same state for each stand-in as for the real command, and that
every help text is the same.
"""

from __future__ import annotations

import importlib
import json
import pathlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, NoReturn

import click

from charter.cli._common import AsciiIntRange
from charter.cli._help import WIDTH

__all__ = [
    "LazyGroup",
    "StandInInvoked",
    "describe",
    "helps_source",
    "index_source",
    "load",
    "recorded_helps",
    "stand_in",
]


class StandInInvoked(Exception):  # noqa: N818 - a signal, not an error
    """A stand-in got past parsing (no help was shown): run the real command."""


def _unset(value: Any) -> bool:
    """click's "no default given" (a sentinel in click >= 8.2, None before)."""
    return type(value).__name__ == "Sentinel"


# -- sub-commands imported when they run ---------------------------------------------


def load(spec: str) -> Any:
    """The attribute named by ``spec`` (``"module:attribute"``), its module imported now."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


class LazyGroup(click.Group):
    """A group whose sub-commands named in ``lazy`` (name -> ``"module:attribute"``) are
    imported only when one is looked up: a light sub-command (``proof verify``) does not
    pay for the imports of a heavy sibling (``proof inclusion``). ``on_load`` hooks (the
    root's global options) are applied to each as it is loaded; :meth:`load_all` loads
    every one (the index is generated from them)."""

    def __init__(self, *args: Any, lazy: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy)
        self._hooks: list[Callable[[click.Command], object]] = []

    def on_load(self, hook: Callable[[click.Command], object]) -> None:
        self._hooks.append(hook)
        for command in self.commands.values():
            hook(command)

    def _load(self, name: str) -> None:
        command: click.Command = load(self._lazy.pop(name))
        for hook in self._hooks:
            hook(command)
        self.add_command(command, name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def load_all(self) -> MutableMapping[str, click.Command]:
        for name in list(self._lazy):
            self._load(name)
        return self.commands


# -- describing a real command ------------------------------------------------------

_RANGES: dict[type[click.ParamType[Any]], str] = {
    AsciiIntRange: "AsciiIntRange",
    click.IntRange: "IntRange",
    click.FloatRange: "FloatRange",
}
_SIMPLE: dict[click.ParamType[Any], str] = {
    click.STRING: "STRING",
    click.BOOL: "BOOL",
    click.INT: "INT",
    click.FLOAT: "FLOAT",
    click.UNPROCESSED: "UNPROCESSED",
}


_PATH_TYPES: dict[Any, str | None] = {None: None, pathlib.Path: "Path"}


def _type(kind: click.ParamType[Any]) -> dict[str, Any]:
    for simple, name in _SIMPLE.items():
        if type(kind) is type(simple):
            return {"name": name}
    if type(kind) in _RANGES:
        assert isinstance(kind, click.IntRange | click.FloatRange)
        return {
            "name": _RANGES[type(kind)],
            "min": kind.min,
            "max": kind.max,
            "min_open": kind.min_open,
            "max_open": kind.max_open,
            "clamp": kind.clamp,
        }
    if type(kind) is click.Choice:
        return {
            "name": "Choice",
            "choices": list(kind.choices),
            "case_sensitive": kind.case_sensitive,
        }
    if type(kind) is click.Path:
        return {
            "name": "Path",
            "exists": kind.exists,
            "file_okay": kind.file_okay,
            "dir_okay": kind.dir_okay,
            "writable": kind.writable,
            "readable": kind.readable,
            "executable": kind.executable,
            "resolve_path": kind.resolve_path,
            "allow_dash": kind.allow_dash,
            "path_type": _PATH_TYPES[kind.type],
        }
    raise TypeError(f"the help index cannot describe a parameter of type {kind!r}")


# The fields of a parameter the index records where they differ from what click gives a
# bare parameter of the same kind; the stand-in is given only those, as the real one
# was, so click's derived state (which option takes a value, which default was given)
# comes out the same.
_OPTION_FIELDS = (
    "nargs", "required", "multiple", "metavar", "help", "hidden", "show_default",
    "count", "envvar", "show_envvar", "show_choices", "is_eager", "expose_value",
    "flag_value", "default",
)  # fmt: skip
_ARGUMENT_FIELDS = ("nargs", "required", "metavar", "default")
_COMMAND_FIELDS: dict[str, Any] = {
    "help": None, "short_help": None, "epilog": None, "options_metavar": "[OPTIONS]",
    "add_help_option": True, "no_args_is_help": False, "hidden": False,
    "deprecated": False, "context_settings": {}, "invoke_without_command": False,
}  # fmt: skip


def _unusual(values: Mapping[str, Any], usual: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if k not in usual or usual[k] != v}


def _shape(param: click.Parameter) -> dict[str, Any]:
    """What decides the rest of a parameter's defaults: always recorded, and given to
    the bare parameter the others are compared with."""
    if isinstance(param, click.Option):
        shape = {"is_flag": param.is_flag, "multiple": param.multiple, "count": param.count}
        return {k: v for k, v in shape.items() if v} | (
            {"nargs": param.nargs} if param.nargs != 1 else {}
        )
    return {"nargs": param.nargs} if param.nargs != 1 else {}


def _bare(param: click.Parameter, shape: Mapping[str, Any]) -> click.Parameter:
    if isinstance(param, click.Option):
        return click.Option(["--x"], **shape)
    return click.Argument(["x"], **shape)


def _param(param: click.Parameter) -> dict[str, Any]:
    if param.secondary_opts:
        raise TypeError(f"the help index cannot describe {param.name}'s secondary options")
    if callable(param.default):
        raise TypeError(f"the help index cannot describe {param.name}'s default")
    option = isinstance(param, click.Option)
    shape = _shape(param)
    bare = _bare(param, shape)
    found: dict[str, Any] = {
        "decls": [*param.opts, param.name] if option else [param.name],
        **({"argument": True} if not option else {}),
        **shape,
    }
    if type(param.type) is not type(bare.type):
        found["type"] = _type(param.type)
    for field in _OPTION_FIELDS if option else _ARGUMENT_FIELDS:
        value = getattr(param, field, None)
        if field not in shape and value != getattr(bare, field, None) and not _unset(value):
            found[field] = value
    return found


def describe(command: click.Command) -> dict[str, Any]:
    """The shape of ``command`` (and of its sub-commands), as JSON data."""
    found: dict[str, Any] = json.loads(json.dumps(_describe(command)))  # tuples as lists
    return found


def _describe(command: click.Command) -> dict[str, Any]:
    fields = {
        field: getattr(command, field) for field in _COMMAND_FIELDS if hasattr(command, field)
    }
    found: dict[str, Any] = {"name": command.name, **_unusual(fields, _COMMAND_FIELDS)}
    found["params"] = [_param(p) for p in command.params]
    if isinstance(command, click.Group):
        subs = command.load_all() if isinstance(command, LazyGroup) else command.commands
        found["commands"] = {name: _describe(sub) for name, sub in subs.items()}
    return found


def index_source(index: Mapping[str, Any], digest: str) -> str:
    """The text of ``_index.py`` for ``index``: one JSON line a command, in a string
    (decoding JSON is several times faster than building the same literal)."""
    lines = ",\n".join(
        json.dumps(name) + ": " + json.dumps(spec, separators=(",", ":"))
        for name, spec in index.items()
    )
    quotes = '"' * 3
    if quotes in lines:  # JSON's own escapes are kept as they are by the raw string
        raise ValueError("the index cannot hold three double quotes in a row")
    return (
        "# ruff: noqa: E501\n"
        '"""Generated by ``scripts/cli-index`` from the commands themselves (see\n'
        '``_lazy.py``); tests/cli/test_startup.py fails when it is stale. Do not edit."""\n'
        "\n"
        "import json\n"
        "from typing import Any\n"
        "\n"
        f"SOURCES = {json.dumps(digest)}\n"
        f"INDEX: dict[str, Any] = json.loads(\n    r{quotes}{{\n{lines}\n}}{quotes}\n)\n"
    )


def _paths(spec: Mapping[str, Any], path: tuple[str, ...]) -> list[tuple[str, ...]]:
    found = [path]
    for name, sub in spec.get("commands", {}).items():
        found += _paths(sub, (*path, name))
    return found


def recorded_helps(
    root: click.Command, index: Mapping[str, Any]
) -> dict[str, tuple[list[str], str]]:
    """What ``charter … --help`` prints (root's included) for every command path of
    ``index``, by click itself at :data:`~charter.cli._help.WIDTH` columns, and which
    help options print it: ``_helps.py``'s record (``charter/cli/_help.py``)."""
    from click.testing import CliRunner

    runner = CliRunner()
    paths = [(), *(p for name, spec in index.items() for p in _paths(spec, (name,)))]
    helps: dict[str, tuple[list[str], str]] = {}
    for path in paths:
        shown: dict[str, str] = {}
        for option in ("--help", "-h"):
            # at least WIDTH columns: click wraps at WIDTH - 2 (CliRunner's own is WIDTH)
            done = runner.invoke(
                root, [*path, option], prog_name="charter", terminal_width=WIDTH - 2
            )
            if done.exit_code == 0:
                shown[option] = done.stdout
        text = shown.get("--help")
        if text is None or not text.endswith("\n"):
            raise ValueError(f"charter {' '.join(path)} --help printed no help")
        helps[" ".join(path)] = ([o for o, t in shown.items() if t == text], text[:-1])
    return helps


def helps_source(helps: Mapping[str, tuple[list[str], str]], digest: str) -> str:
    """The text of ``_helps.py`` for ``helps``: string constants, which a module's
    bytecode loads faster than it would parse them."""
    return (
        "# ruff: noqa: E501\n"
        '"""Generated by ``scripts/cli-index`` from the commands themselves (see\n'
        '``_help.py``); tests/cli/test_startup.py fails when it is stale. Do not edit."""\n'
        "\n"
        f"SOURCES = {digest!r}\n"
        "HELPS: dict[str, tuple[tuple[str, ...], str]] = {\n"
        + "".join(
            f"    {path!r}: ({tuple(names)!r}, {text!r}),\n"
            for path, (names, text) in helps.items()
        )
        + "}\n"
    )


# -- building a stand-in -------------------------------------------------------------


def _build_type(spec: Mapping[str, Any]) -> click.ParamType[Any]:
    name = spec["name"]
    for simple, simple_name in _SIMPLE.items():
        if name == simple_name:
            return simple
    args = {k: v for k, v in spec.items() if k != "name"}
    if name == "Choice":
        return click.Choice(args["choices"], case_sensitive=args["case_sensitive"])
    if name == "Path":
        path_type = pathlib.Path if args.pop("path_type") == "Path" else None
        return click.Path(path_type=path_type, **args)
    ranges = {"AsciiIntRange": AsciiIntRange, "IntRange": click.IntRange}
    if name in ranges:
        return ranges[name](**args)
    return click.FloatRange(**args)


def _build_param(spec: Mapping[str, Any]) -> click.Parameter:
    fields = {k: v for k, v in spec.items() if k not in ("argument", "decls", "type")}
    if "type" in spec:
        fields["type"] = _build_type(spec["type"])
    if spec.get("argument"):
        return click.Argument(spec["decls"], **fields)
    return click.Option(spec["decls"], **fields)


def _never_run(**_: Any) -> NoReturn:
    raise StandInInvoked


def _group_runs(**_: Any) -> None:
    """A group's own callback runs before its sub-command parses: only a group invoked
    without one would act."""
    if click.get_current_context().invoked_subcommand is None:
        raise StandInInvoked


def stand_in(spec: Mapping[str, Any]) -> click.Command:
    """A click command of ``spec``'s shape that parses, helps and completes as the
    real one, and raises :class:`StandInInvoked` instead of running."""
    common: dict[str, Any] = {
        **_COMMAND_FIELDS,
        **{k: v for k, v in spec.items() if k not in ("name", "params", "commands")},
        "params": [_build_param(p) for p in spec["params"]],
    }
    common["context_settings"] = dict(common["context_settings"])
    if "commands" in spec:
        return click.Group(
            spec["name"],
            commands={name: stand_in(sub) for name, sub in spec["commands"].items()},
            callback=_group_runs,
            **common,
        )
    del common["invoke_without_command"]
    return click.Command(spec["name"], callback=_never_run, **common)
