"""A recipe's options as one typed config: the parser, the ``--config`` file and the checks come from it.

A recipe declares its options once, as a frozen dataclass: each field an :func:`option` (default,
help, choices, a check) and each stage's options a nested dataclass declared with :func:`group`,
whose flags share a prefix (``prune.max_drop`` is ``--prune-max-drop``). :func:`parse_config`
builds the ``argparse`` parser from that dataclass, reads ``--config FILE`` (YAML or JSON, the
shape ``--print-config`` prints) as new defaults that flags override, and returns the config;
:func:`validate` (each config's ``__post_init__``) stops a bad value with an error naming the
flag, the value and the fix, whether it came from a flag, a file or Python.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from nestflex.errors import NestflexError

__all__ = ["Check", "ConfigError", "at_least", "build_parser", "group", "option", "parse_config", "stage_list",
           "stages_option", "to_dict", "validate"]


class ConfigError(NestflexError, ValueError):
    """A recipe option has a value the recipe cannot run with."""


class Check(NamedTuple):
    """What a value must satisfy: ``ok(value)``, else the error says ``need`` (a text, or a
    function of the value) and the ``hint``."""

    ok: Callable[[Any], bool]
    need: str | Callable[[Any], str]
    hint: str = ""


def at_least(low: float, unit: str = "", hint: str = "") -> Check:
    """``value >= low``; the error reads ``must be >= {low}{unit}``."""
    return Check(lambda v: v >= low, f"must be >= {low}{unit}", hint)


def option(default: Any, help: str, *, flag: str | None = None, choices: Sequence[Any] | None = None,
           check: Check | None = None) -> Any:
    """A config field: its default, its ``--help`` text, and optionally its flag (default
    ``--<prefix>-<name>``), its allowed values and a :class:`Check`."""
    return dataclasses.field(default=default,
                             metadata={"help": help, "flag": flag, "choices": choices, "check": check})


def group(cls: type, prefix: str, title: str) -> Any:
    """A nested dataclass of options whose flags start with ``--<prefix>-``, shown under ``title``."""
    return dataclasses.field(default_factory=cls, metadata={"prefix": prefix, "title": title})


def stage_list(stages: str, names: Sequence[str]) -> list[str]:
    """``--stages`` as a list: ``all`` (every one of ``names``, in order) or a comma list (blanks dropped)."""
    return list(names) if stages == "all" else [s.strip() for s in stages.split(",") if s.strip()]


def stages_option(names: Sequence[str]) -> Any:
    """The ``--stages`` field: ``all`` (default) or a comma list of ``names``, checked."""

    def need(stages: str) -> str:
        unknown = [s for s in stage_list(stages, names) if s not in names]
        return f"has unknown stage(s) {unknown or [stages]}; choose from {', '.join(names)} or all"

    ok = Check(lambda v: bool(stage_list(v, names)) and set(stage_list(v, names)) <= set(names), need)
    return option("all", f"comma list of {', '.join(names)}, or all", check=ok)


class _Option(NamedTuple):
    path: tuple[str, ...]  # ("prune", "max_drop"): where the value lives in the config
    flag: str
    dest: str
    kind: type  # bool, int, float or str
    optional: bool  # None is a value
    field: dataclasses.Field
    title: str | None


def _options(cls: type) -> list[_Option]:
    def walk(owner: type, path: tuple[str, ...], prefix: str, title: str | None):
        hints = typing.get_type_hints(owner)
        for f in dataclasses.fields(owner):
            tp = hints[f.name]
            if "prefix" in f.metadata:
                yield from walk(tp, (f.name,), f.metadata["prefix"], f.metadata["title"])
                continue
            args = typing.get_args(tp)
            optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args
            kind = next(a for a in args if a is not type(None)) if optional else tp
            flag = f.metadata["flag"] or "--" + "-".join(filter(None, [prefix, f.name.replace("_", "-")]))
            yield _Option((*path, f.name), flag, flag[2:].replace("-", "_"), kind, optional, f, title)

    return list(walk(cls, (), "", None))


def _get(config: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        config = getattr(config, name)
    return config


def validate(config: Any) -> None:
    """Raise :class:`ConfigError` for the first value outside its choices or failing its check."""
    for o in _options(type(config)):
        value, meta = _get(config, o.path), o.field.metadata
        if value is None and o.optional:
            continue
        if meta["choices"] is not None and value not in meta["choices"]:
            raise ConfigError(f"{o.flag} must be one of {', '.join(map(str, meta['choices']))}, got {value!r}")
        check = meta["check"]
        if check is not None and not check.ok(value):
            need = check.need(value) if callable(check.need) else check.need
            raise ConfigError(f"{o.flag} {need}, got {value!r}" + (f". HINT: {check.hint}" if check.hint else ""))


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain data, in the shape ``--config`` reads."""
    return dataclasses.asdict(config)


def _coerce(o: _Option, value: Any, where: str) -> Any:
    """A value read from a file, as the flag's type (a string is read as the command line would)."""
    if value is None and o.optional:
        return None
    try:
        if o.kind is bool and isinstance(value, bool):
            return value
        if o.kind is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        if o.kind in (int, float) and not isinstance(value, bool):
            if isinstance(value, str) or (o.kind is float and isinstance(value, int)):
                return o.kind(value)
            if isinstance(value, o.kind):
                return value
    except ValueError:
        pass
    kind = o.kind.__name__ + (" or null" if o.optional else "")
    raise ConfigError(f"{where}: `{'.'.join(o.path)}` ({o.flag}) must be of type {kind}, got {value!r}. "
                      f"HINT: its default is {o.field.default!r}")


def _read_file(cls: type, file: str) -> dict[str, Any]:
    """``{dest: value}`` from a YAML or JSON file shaped like the config (groups as mappings)."""
    try:
        text = Path(file).read_text()
        if Path(file).suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as err:  # a missing file, or a syntax error (json's ValueError, yaml's YAMLError)
        raise ConfigError(f"--config {file}: cannot read it: {err}. HINT: a YAML (.yaml, .yml) or JSON "
                          f"file of options, as --print-config writes it") from err
    if not isinstance(data, dict):
        raise ConfigError(f"--config {file}: expected a mapping of options, got {type(data).__name__}")
    options = {o.path: o for o in _options(cls)}
    groups = {o.path[0] for o in options.values() if len(o.path) == 2}
    values = {}
    for key, value in data.items():
        items = value.items() if key in groups and isinstance(value, dict) else [(None, value)]
        for sub, v in items:
            path = (str(key),) if sub is None else (str(key), str(sub))
            if path not in options:
                raise ConfigError(f"--config {file}: unknown option `{'.'.join(path)}`. HINT: known options are "
                                  f"{', '.join('.'.join(p) for p in options)} (--print-config shows them)")
            values[options[path].dest] = _coerce(options[path], v, f"--config {file}")
    return values


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The recipe's docstring as written, and each option's default after its help."""


def build_parser(cls: type, description: str | None = None) -> argparse.ArgumentParser:
    """The ``argparse`` parser of a config dataclass: one flag per field, stage groups as sections."""
    p = argparse.ArgumentParser(description=description, formatter_class=_Formatter)
    p.add_argument("--config", metavar="FILE", default=None,
                   help="YAML or JSON file of options, shaped as --print-config prints them; flags override it")
    p.add_argument("--print-config", action="store_true", help="print the resolved options as JSON and exit")
    sections: dict[str | None, Any] = {None: p}
    for o in _options(cls):
        if o.title not in sections:
            sections[o.title] = p.add_argument_group(o.title)
        meta = o.field.metadata
        kwargs: dict[str, Any] = {"dest": o.dest, "default": o.field.default, "help": meta["help"].replace("%", "%%")}
        if o.kind is bool:  # --flag / --no-flag, so a flag can undo what a --config file set
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs.update(type=o.kind, choices=meta["choices"])
        sections[o.title].add_argument(o.flag, **kwargs)
    return p


def _build(cls: type, values: dict[str, Any]) -> Any:
    """The config from ``{dest: value}``; its ``__post_init__`` validates it."""
    nested: dict[tuple[str, ...], dict[str, Any]] = {(): {}}
    for o in _options(cls):
        nested.setdefault(o.path[:-1], {})[o.path[-1]] = values[o.dest]
    hints = typing.get_type_hints(cls)
    groups = {name[0]: hints[name[0]](**kw) for name, kw in nested.items() if name}
    return cls(**nested[()], **groups)


def parse_config(cls: type, argv: Sequence[str] | None = None, description: str | None = None) -> Any:
    """Parse ``argv`` into a ``cls`` config: field defaults, then ``--config FILE``, then flags.

    A bad value stops the parser (exit status 2) with the error naming the flag, the value and the fix.
    """
    parser = build_parser(cls, description)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    file = pre.parse_known_args(argv)[0].config
    try:
        if file is not None:
            parser.set_defaults(**_read_file(cls, file))
        args = parser.parse_args(argv)
        config = _build(cls, vars(args))
    except ConfigError as err:
        parser.error(str(err))
    if args.print_config:
        print(json.dumps(to_dict(config), indent=2))
        parser.exit()
    return config
