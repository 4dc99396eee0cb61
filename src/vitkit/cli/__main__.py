"""``python -m vitkit.cli``: the ``vitkit`` program, as ``python -m vitkit``."""

from .main import program

program()
