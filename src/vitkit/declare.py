"""Declared settings: every field of a config (a recipe's, a model's) is declared once, with its kind, default,
range and help, and that one declaration reads it from YAML/JSON, command-line text and Python, checks it, and
makes its flag. Every refusal has one shape: ``<source>: <section>.<field>: expected <what>, got <value>``."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import yaml

from .errors import ConfigError, abridged

LARGEST_INT = 2**63  # 64 bits: what torch takes (a seed, a step count, a layer's width)


class FieldError(ConfigError):
    """A field's value refused: ``source`` (a file, the command line, the class built in Python), ``where``
    (``section.field``) and what was wrong, kept apart so that a reader of a file can name the file."""

    def __init__(self, source: str, where: str, detail: str) -> None:
        super().__init__(f"{source}: {where}: {detail}")
        self.source, self.where, self.detail = source, where, detail

    def at(self, source: str) -> "FieldError":
        """The same refusal, said of ``source``."""
        return FieldError(source, self.where, self.detail)


class Invalid(Exception):
    """Raised by a kind: what the value was expected to be (made into a FieldError by the caller)."""


def refuse(source: str, where: str, expected: str, value: Any) -> FieldError:
    """The error of one shape for a value that is not what was expected."""
    return FieldError(source, where, f"expected {expected}, got {abridged(value)}")


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` (no dot) as a string; a config means a number, as JSON does."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))


def load_yaml(text: str) -> Any:
    """YAML read as configs mean it (exponents without a dot are numbers)."""
    return yaml.load(text, Loader=_Loader)


def scalar(text: str) -> Any:
    """Command-line text as a value: an int or a float as Python reads them (``nan`` and ``inf`` too, so that a
    number field can say it wants a finite one), ``null``/``true``/``false`` as a recipe file writes them;
    other text stays text."""
    for read in (int, float):
        try:
            return read(text)
        except ValueError:
            pass
    words = {"null": None, "none": None, "true": True, "false": False}
    return words.get(text.strip().lower(), text)


class Kind:
    """What a field holds: ``accept`` normalises a value (JSON/YAML/Python) or raises ``Invalid``;
    ``from_text`` reads one command-line word; ``expected`` says it in words."""

    expected = "a value"
    metavar = "VALUE"

    def accept(self, value: Any) -> Any:
        return value

    def from_text(self, text: str) -> Any:
        return self.accept(scalar(text))


def _bound(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """A range in words: ``in [0, 1)``, ``>= 1``, ``> 0``."""
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high}"
    return ""


@dataclass(frozen=True)
class Number(Kind):
    """An int (64-bit) or a finite float, within bounds (``low_open``/``high_open``: the bound itself excluded)."""

    integer: bool = False
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @property
    def expected(self) -> str:
        bound = _bound(self.low, self.high, self.low_open, self.high_open)
        return f"{'an int' if self.integer else 'a number'}{' ' + bound if bound else ''}"

    @property
    def metavar(self) -> str:
        return "INT" if self.integer else "FLOAT"

    def accept(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            raise Invalid(self.expected)
        if not self.integer and not math.isfinite(value):
            raise Invalid(self.expected.replace("a number", "a finite number", 1))
        value = value if self.integer else float(value)
        if ((self.low is not None and (value <= self.low if self.low_open else value < self.low))
                or (self.high is not None and (value >= self.high if self.high_open else value > self.high))):
            raise Invalid(self.expected)
        if self.integer and not -LARGEST_INT <= value < LARGEST_INT:
            raise Invalid(f"{self.expected} that fits in 64 bits")
        return value


def Int(low: float | None = None, high: float | None = None) -> Number:
    """An int in [low, high] (either end open-ended when None)."""
    return Number(True, low, high)


def Float(low: float | None = None, high: float | None = None, low_open: bool = False,
          high_open: bool = False) -> Number:
    """A finite number within the bounds (``low_open``/``high_open``: the bound itself excluded)."""
    return Number(False, low, high, low_open, high_open)


class Bool(Kind):
    """true or false (an int is not taken for one)."""

    expected = "true or false"

    def accept(self, value: Any) -> Any:
        if not isinstance(value, bool):
            raise Invalid(self.expected)
        return value


class Text(Kind):
    """A string, taken as written on the command line."""

    expected = "a string"
    metavar = "TEXT"

    def accept(self, value: Any) -> Any:
        if not isinstance(value, str):
            raise Invalid(self.expected)
        return value

    def from_text(self, text: str) -> Any:
        return text


@dataclass(frozen=True)
class Choice(Kind):
    """One of a fixed list of words."""

    choices: tuple[str, ...]

    @property
    def expected(self) -> str:
        return f"one of {list(self.choices)}"

    def accept(self, value: Any) -> Any:
        if not isinstance(value, str) or value not in self.choices:
            raise Invalid(self.expected)
        return value

    def from_text(self, text: str) -> Any:
        return self.accept(text)


@dataclass(frozen=True)
class Maybe(Kind):
    """``kind``, or null (``off`` in words, say what null means)."""

    kind: Kind
    off: str = "null"

    @property
    def expected(self) -> str:
        return f"{self.kind.expected}, or {self.off}"

    @property
    def metavar(self) -> str:
        return self.kind.metavar

    def accept(self, value: Any) -> Any:
        if value is None:
            return None
        try:
            return self.kind.accept(value)
        except Invalid as error:
            raise Invalid(f"{error}, or {self.off}") from None

    def from_text(self, text: str) -> Any:
        if text.lower() in ("null", "none"):
            return None
        try:
            return self.kind.from_text(text)
        except Invalid as error:
            raise Invalid(f"{error}, or {self.off}") from None


@dataclass(frozen=True)
class Items(Kind):
    """A list of ``kind`` (``length`` of them, or any number when None), held as a tuple; ``rule`` and
    ``says`` add a test of the whole (``0 < low <= high <= 1``)."""

    kind: Kind
    length: int | None = None
    rule: Callable[[tuple], bool] | None = None
    says: str = ""

    @property
    def expected(self) -> str:
        count = f"{self.length} " if self.length else "a list of "
        return self.says or f"{count}values, each {self.kind.expected}"

    @property
    def metavar(self) -> str:
        return self.kind.metavar

    def accept(self, value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or (self.length is not None and len(value) != self.length):
            raise Invalid(self.expected)
        try:
            items = tuple(self.kind.accept(item) for item in value)
        except Invalid:
            raise Invalid(self.expected) from None
        if self.rule is not None and not self.rule(items):
            raise Invalid(self.expected)
        return items


class Mapping(Kind):
    """A mapping of names to values (JSON object), checked by the config it is handed to."""

    expected = "a mapping (JSON object) of names to values"

    def accept(self, value: Any) -> Any:
        if not (isinstance(value, dict) and all(isinstance(key, str) for key in value)):
            raise Invalid(self.expected)
        return dict(value)


@dataclass(frozen=True)
class Parsed(Kind):
    """A kind read by a function of its own (an image size's forms); ``parse`` raises ``Invalid`` or
    ConfigError when it refuses."""

    parse: Callable[[Any], Any]
    says: str
    metavar: str = "VALUE"

    @property
    def expected(self) -> str:
        return self.says

    def accept(self, value: Any) -> Any:
        try:
            return self.parse(value)
        except (Invalid, ConfigError):
            raise Invalid(self.says) from None

    def from_text(self, text: str) -> Any:
        return self.accept(text)


@dataclass(frozen=True)
class Setting:
    """One field's declaration: its kind, help, the flat name it had (``alias``, also its flag's name) and other
    spellings of its flag (``short``)."""

    kind: Kind
    help: str = ""
    alias: str | None = None
    short: tuple[str, ...] = ()


def setting(default: Any, kind: Kind, help: str = "", *, alias: str | None = None,
            short: tuple[str, ...] = ()) -> Any:
    """A dataclass field declared with its kind and help (mutable defaults are copied for every instance)."""
    metadata = {"setting": Setting(kind, help, alias, short)}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def declared(cls: type) -> list[tuple[str, Setting, Any]]:
    """(name, declaration, default) of every declared field of dataclass ``cls``, in order."""
    found = []
    for item in dataclasses.fields(cls):
        if "setting" in item.metadata:
            default = item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
            found.append((item.name, item.metadata["setting"], default))
    return found


def help_of(cls: type, name: str) -> str:
    """The help declared for field ``name`` of ``cls`` (for a flag made by hand, as ``--set`` is)."""
    return next(declaration.help for field_name, declaration, _ in declared(cls) if field_name == name)


def dotted(section: str, name: str) -> str:
    """``section.name``, or ``name`` alone in a flat config."""
    return f"{section}.{name}" if section else name


def check_fields(config: Any, source: str, section: str = "") -> None:
    """Every declared field of ``config`` read and normalised by its kind, in place; the first refusal raised
    as a FieldError naming ``source`` and ``section.field``."""
    for name, declaration, _ in declared(type(config)):
        value = getattr(config, name)
        try:
            setattr(config, name, declaration.kind.accept(value))
        except Invalid as error:
            raise refuse(source, dotted(section, name), str(error), value) from None


def require(ok: bool, source: str, where: str, expected: str, value: Any) -> None:
    """A rule between fields: when it does not hold, the error of one shape for the field at ``where``."""
    if not ok:
        raise refuse(source, where, expected, value)


def check_keys(data: dict[str, Any], known: Iterable[str], source: str, section: str = "",
               suggestions: dict[str, str] | None = None) -> None:
    """Refuse the first key of ``data`` that is not in ``known``, with the nearest known names; ``suggestions``
    maps other spellings (a field's flat name) to where they now live."""
    known = list(known)
    names = {name: dotted(section, name) for name in known} | (suggestions or {})
    for key in data:
        if key not in known:
            near = difflib.get_close_matches(str(key), list(names), n=2)
            hint = f"; did you mean {' or '.join(names[name] for name in near)}?" if near else ""
            raise FieldError(source, dotted(section, str(key)), f"unknown key{hint}")
