"""``python -m vitkit``: the ``vitkit`` program (``vitkit.cli``), for where the console script is not on
PATH; nothing here but the call."""

from .cli import program

program()
