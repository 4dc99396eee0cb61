"""MkDocs hook: pages that are generated at build time, so that they cannot drift from what they describe.

``<!-- cli-reference -->`` becomes the reference of every ``vitkit`` subcommand, read off the argparse parser that
the command itself uses (``vitkit.cli.build_parser``): usage, description, each flag with its default and help, and
the examples of the epilog. ``<!-- results: NAME.md -->`` becomes the tables of ``benchmarks/results/NAME.md``, so
the benchmarks page quotes the measured numbers as the benchmark scripts wrote them. ``<!-- changelog -->`` becomes
``CHANGELOG.md``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
CLI_MARK = "<!-- cli-reference -->"
CHANGELOG_MARK = "<!-- changelog -->"
RESULTS_MARK = re.compile(r"<!-- results: ([\w.-]+\.md) -->")


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Fill the markers of a page with what they stand for."""
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if CHANGELOG_MARK in markdown:
        markdown = markdown.replace(CHANGELOG_MARK, (ROOT / "CHANGELOG.md").read_text())
    return RESULTS_MARK.sub(lambda match: results_tables(match.group(1)), markdown)


# Docstrings cross-reference in Sphinx's roles (:func:`name`); the site shows the name as code.
SPHINX_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data):(?=<code>)")


def on_page_content(html: str, page, config, files) -> str:
    """Drop the Sphinx roles left in rendered docstrings."""
    return SPHINX_ROLE.sub("", html)


def results_tables(name: str) -> str:
    """The markdown tables of one results file, each table's lines as the benchmark wrote them."""
    path = RESULTS / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: results file named by the docs is missing")
    blocks, current = [], []
    for line in path.read_text().splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append("\n".join(current))
            current = []
    if not blocks:
        raise ValueError(f"{path}: expected a markdown table")
    return "\n\n".join(blocks)


def cli_reference() -> str:
    """Markdown for the ``vitkit`` parser and every (nested) subcommand, in the order ``vitkit --help`` lists them."""
    sys.path.insert(0, str(ROOT / "src"))
    from vitkit.cli import build_parser
    from vitkit.declare_flags import flag_defaults
    from vitkit.train.recipes import SECTIONS

    recipe_defaults = flag_defaults(SECTIONS.items())
    return "\n\n".join(command_section(name, parser, recipe_defaults) for name, parser in commands("vitkit",
                                                                                                  build_parser()))


def commands(name: str, parser: argparse.ArgumentParser):
    """(full command name, parser) for ``parser`` and each subcommand below it, depth first."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub_parser in action.choices.items():
                yield from commands(f"{name} {sub_name}", sub_parser)


def command_section(name: str, parser: argparse.ArgumentParser, recipe_defaults: dict) -> str:
    """One subcommand: heading, description, usage, a table of its arguments, its examples."""
    depth = name.count(" ")
    parts = [f"{'#' * min(depth + 2, 4)} `{name}`"]
    if parser.description:
        parts.append(parser.description)
    usage = parser.format_usage().removeprefix("usage: ").strip()
    parts.append(f"```text\n{usage}\n```")
    rows = [argument_row(action, recipe_defaults) for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))]
    if rows:
        parts.append("| argument | default | help |\n|---|---|---|\n" + "\n".join(rows))
    subcommands = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for action in subcommands:
        listing = "\n".join(f"| `{choice.dest}` | {cell(choice.help or '')} |" for choice in action._choices_actions)
        parts.append("| subcommand | what it does |\n|---|---|\n" + listing)
    if parser.epilog:
        parts.append(f"```text\n{parser.epilog.strip()}\n```")
    return "\n\n".join(parts)


def argument_row(action: argparse.Action, recipe_defaults: dict) -> str:
    """``| flags | default | help |`` for one argument; a recipe flag's default is the recipe field's."""
    if action.option_strings:
        flags = ", ".join(action.option_strings)
        if action.nargs != 0 and action.metavar is not None or action.choices is None and action.nargs != 0:
            flags += f" {action.metavar or action.dest.upper()}"
    else:
        flags = action.metavar or action.dest
    help_text = action.help if action.help is not argparse.SUPPRESS else ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        help_text = f"{help_text} (one of: {', '.join(map(str, action.choices))})".strip()
    return f"| `{flags}` | {cell(default_text(action, recipe_defaults))} | {cell(help_text or '')} |"


def default_text(action: argparse.Action, recipe_defaults: dict) -> str:
    """The default as a user sees it: a flag that leaves the recipe alone shows the recipe field's default."""
    if action.required and action.nargs not in ("*", "?"):
        return "required"
    default = action.default
    if default is argparse.SUPPRESS:
        if action.dest not in recipe_defaults:
            return ""
        return f"recipe: `{recipe_defaults[action.dest]!r}`, or the preset's"
    if default is None or default is False or default == {}:
        return ""
    if isinstance(default, list):
        default = " ".join(map(str, default))
    return f"`{default}`"


def cell(text: str) -> str:
    """Text that stays inside one markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")
