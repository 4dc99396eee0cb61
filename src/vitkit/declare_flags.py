"""Command-line flags generated from declared settings (``vitkit.declare``): one flag per field, read by the
field's kind, its help and choices the declaration's, so that flags cannot drift from the fields they set."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any

from .declare import Bool, Choice, Invalid, Items, Kind, Setting, declared, dotted
from .errors import abridged

FLAG_PREFIX = "setting:"  # the argparse destination of a declared field's flag: setting:section.field


def flag_name(name: str, declaration: Setting) -> str:
    """``--batch-size``: the field's flat name (its alias where it has one), dashed."""
    return "--" + (declaration.alias or name).replace("_", "-")


def reader(kind: Kind, where: str = "") -> Callable[[str], Any]:
    """An argparse type: a flag's text read by ``kind``; a refusal says the one shape (``where``: the field)."""
    def read(text: str) -> Any:
        try:
            return kind.from_text(text)
        except Invalid as error:
            raise argparse.ArgumentTypeError(f"{where + ': ' if where else ''}expected {error}, "
                                             f"got {abridged(text)}") from None
    read.__name__ = type(kind).__name__.lower()
    return read


def add_flags(parser: argparse.ArgumentParser, sections: Iterable[tuple[str, type]], title: str = "",
              skip: Iterable[str] = ()) -> dict[str, Any]:
    """One flag per declared field of each (section name, dataclass), in a help group per section: the kind
    reads the text, the help and choices are the declaration's; an unset flag leaves the field alone. Fields in
    ``skip`` (``section.field``) get flags of their own from the caller, in the group returned for the section."""
    skip, groups = set(skip), {}
    for section, cls in sections:
        group = groups[section] = parser.add_argument_group(f"{title}{section}")
        for name, declaration, _ in declared(cls):
            where = dotted(section, name)
            if where in skip:
                continue
            flags = (flag_name(name, declaration), *declaration.short)
            common = dict(dest=FLAG_PREFIX + where, default=argparse.SUPPRESS, help=declaration.help.replace("%", "%%"))
            kind = declaration.kind
            if isinstance(kind, Bool):
                group.add_argument(*flags, action=argparse.BooleanOptionalAction, **common)
            elif isinstance(kind, Choice):
                group.add_argument(*flags, choices=kind.choices, type=reader(kind, where), **common)
            elif isinstance(kind, Items) and kind.length:
                group.add_argument(*flags, type=reader(kind.kind, where), nargs=kind.length, metavar=kind.metavar,
                                   **common)
            else:
                group.add_argument(*flags, type=reader(kind, where), metavar=kind.metavar, **common)
    return groups


def flag_defaults(sections: Iterable[tuple[str, type]]) -> dict[str, Any]:
    """The argparse destination of every declared field's flag -> the field's default (what an unset flag
    leaves in place, unless a preset or file says otherwise): for help pages."""
    return {FLAG_PREFIX + dotted(section, name): default
            for section, cls in sections for name, _, default in declared(cls)}


def flag_values(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The declared fields given on the command line, as ``{section: {field: value}}`` (flat configs: ``""``)."""
    values: dict[str, dict[str, Any]] = {}
    for dest, value in vars(args).items():
        if dest.startswith(FLAG_PREFIX):
            section, _, name = dest[len(FLAG_PREFIX):].rpartition(".")
            values.setdefault(section, {})[name] = value
    return values
