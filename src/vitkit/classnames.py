"""Class names as one printable line of UTF-8, and back: the one encoding every writer and reader of class names
uses (``classes.txt``, tables printed, plots drawn).

A class name is any string: a folder name may hold a line break, a control character or bytes that are not
UTF-8 (Python lists such a folder with them as surrogate escapes, ``\\udcXX``). Written as it is, a line break
would split one class into two lines of ``classes.txt`` and a surrogate cannot be written as UTF-8 at all.
So a backslash is written ``\\\\``; a line break, tab or carriage return ``\\n``, ``\\t``, ``\\r``; any other
character that is not printable (control and format characters, line and paragraph separators, surrogates)
``\\xHH`` or ``\\uHHHH``. Everything else, non-ASCII letters included, is written as it is, so a list of
ordinary names reads as the names. Reading undoes exactly these escapes; a backslash that starts none of them
(a list another tool wrote) is kept as it is.
"""

from __future__ import annotations

import re

_SHORT = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_ESCAPE = re.compile(r"\\(?:\\|n|t|r|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})")


def escape_name(name: str) -> str:
    """``name`` as one printable line of UTF-8 text (see the module doc); ``unescape_name`` gives it back."""
    return "".join(_SHORT.get(char) or (char if char.isprintable() else _code(char)) for char in name)


def _code(char: str) -> str:
    point = ord(char)
    return f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}" if point < 0x10000 else f"\\U{point:08x}"


def unescape_name(text: str) -> str:
    """The class name that ``escape_name`` wrote as ``text``."""
    return _ESCAPE.sub(_unescaped, text)


def _unescaped(match: re.Match) -> str:
    code = match.group()
    return {"\\\\": "\\", "\\n": "\n", "\\t": "\t", "\\r": "\r"}.get(code) or chr(int(code[2:], 16))


def format_class_list(names: list[str]) -> str:
    """The text of a ``classes.txt``: each name escaped, one a line."""
    return "".join(f"{escape_name(name)}\n" for name in names)


def parse_class_list(text: str) -> list[str]:
    """The names of a ``classes.txt`` text (as ``format_class_list`` writes it): lines split at ``\\n`` only (the
    other characters ``str.splitlines`` splits at may stand in another tool's names), a Windows ``\\r\\n`` taken
    as one line end."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [unescape_name(line.removesuffix("\r")) for line in lines]
