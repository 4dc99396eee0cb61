"""The ``vitkit`` program: the top-level parser, which gathers the subcommands of the modules in ``COMMANDS``
(each adds its own with ``register`` and its help with ``HELP``), refuses an unknown option with the closest
ones, and turns the errors a command raises into one line and an exit status."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import sys
import traceback
import typing
from collections.abc import Callable, Iterator, Sequence

import torch

from .. import __version__
from ..errors import ConfigError, VitkitError
from . import analyze, bench, convert, data, fewshot, models, predict, serve, train, transfer, zeroshot
from . import eval as eval_

# The command modules in the order ``vitkit --help`` lists their commands; a new command is a new module here.
COMMANDS = (models, convert, analyze, train, eval_, fewshot, transfer, data, predict, zeroshot, serve, bench)

# What `vitkit COMMAND --help` says above and below the flags: one line, and examples for the main commands.
HELP: dict[str, tuple[str, str | None]] = {
    "vitkit": ("Vision Transformers: load any checkpoint, train, fine-tune, evaluate, analyse, export and benchmark.",
               "examples:\n"
               "  vitkit train                                  a small ViT on the embedded digits\n"
               "  vitkit info hf-hub:google/vit-base-patch16-224\n"
               "  vitkit eval runs/x/model --dataset mnist --data-dir data\n"
               "  vitkit COMMAND --help                         the flags of one command"),
}
COMMAND_HELP = {**HELP, **{name: text for module in COMMANDS for name, text in module.HELP.items()}}


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``vitkit`` command, as ``main`` and the CLI reference of the docs read it."""
    parser = _Parser(prog="vitkit")
    parser.add_argument("--version", action="version", version=f"vitkit {__version__} (torch {torch.__version__})")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.register(sub)
    debug = dict(action="store_true", help="show the traceback of an error (also: VITKIT_DEBUG=1)")
    parser.add_argument("--debug", **debug)
    for command in sub.choices.values():  # also after the command: vitkit train --debug
        command.add_argument("--debug", **debug, default=argparse.SUPPRESS)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give the parser and each subcommand (``data``'s too) its line of COMMAND_HELP and its examples, laid out
    as written."""
    commands = [("vitkit", parser)]
    for name, command in commands:
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                commands += [(f"{name} {sub}".removeprefix("vitkit "), choice) for sub, choice in action.choices.items()]
        command.description, command.epilog = COMMAND_HELP[name]
        command.formatter_class = argparse.RawDescriptionHelpFormatter


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that refuses an unknown option with the usage of the (sub)command it was given to and
    that command's closest options (``vitkit train --learning-rate 1e-3``: did you mean --lr?)."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._command_parser(parsed)
            command.error(f"unrecognized arguments: {' '.join(extras)}{_did_you_mean(extras, command)}")
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost subcommand's parser that ``parsed`` went through (``vitkit data info``: info's)."""
        parser: argparse.ArgumentParser = self
        while True:
            chosen = next((action.choices.get(getattr(parsed, action.dest, None)) for action in parser._actions
                           if isinstance(action, argparse._SubParsersAction)), None)
            if chosen is None:
                return parser
            parser = chosen


def _did_you_mean(extras: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """``; did you mean --lr?`` for each unknown option among ``extras`` that is close to one of ``parser``'s:
    the same words with ``_`` for ``-``, their initials (learning-rate: lr), or a near spelling."""
    options = [option for action in parser._actions for option in action.option_strings if option.startswith("--")]
    hints = []
    for word in extras:
        if not word.startswith("--"):
            continue
        name = word[2:].split("=", 1)[0].replace("_", "-").lower()
        initials = "".join(part[0] for part in name.split("-") if part)
        close = [option for option in options if option[2:] in (name, initials)] or \
            difflib.get_close_matches(f"--{name}", options, n=3, cutoff=0.6)
        if close:
            hints.append(f"{word.split('=', 1)[0]}: did you mean {' or '.join(close)}?")
    return "".join(f"; {hint}" for hint in hints)


# Exit statuses: 2 for a command line or recipe that cannot work (as argparse's own usage errors), 1 for
# a failure while running (a bad file, a full disk, a diverged run), 130 when interrupted by Ctrl-C.
USAGE_ERROR, RUNTIME_ERROR, INTERRUPTED = 2, 1, 130


def describe(error: BaseException) -> str:
    """One line naming what was wrong: an OS error as ``FILE: reason`` rather than ``[Errno 2] ...``."""
    if isinstance(error, OSError) and error.strerror:
        names = " -> ".join(os.fsdecode(name) if isinstance(name, bytes) else str(name)
                            for name in (error.filename, error.filename2) if name is not None)
        return f"{names}: {error.strerror}" if names else error.strerror
    text = str(error) or type(error).__name__
    if "\nOriginal Traceback" in text:  # raised in a DataLoader worker: torch put its traceback into the message
        text = text.rstrip().rsplit("\n", 1)[-1].split(": ", 1)[-1]
    return text


@contextlib.contextmanager
def library_messages() -> Iterator[None]:
    """While a command runs, the messages vitkit's modules log (``logging``, INFO and up) are plain lines on
    stderr, as the command's own; on a terminal they appear above any progress bar."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    logger = logging.getLogger("vitkit")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with logging_redirect_tqdm([logger]):
            yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; errors the user can act on are one line on stderr (``--debug`` or
    ``VITKIT_DEBUG=1`` adds the traceback), anything else is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("VITKIT_DEBUG", "") not in ("", "0")
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        with library_messages():
            return run(args)
    except (VitkitError, OSError, ImportError) as error:
        if debug:
            traceback.print_exc()
        print(f"vitkit {args.command}: error: {describe(error)}", file=sys.stderr)
        return USAGE_ERROR if isinstance(error, ConfigError) else RUNTIME_ERROR
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"vitkit {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED


def program() -> typing.NoReturn:
    """The ``vitkit`` program. A process that torchrun started ends at once when its command has
    returned (``os._exit``): the interpreter's teardown is skipped, since gloo's threads, torn down
    there, could still abort a run that had finished ("terminate called without an active exception")."""
    code = main()
    if "TORCHELASTIC_RUN_ID" in os.environ:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
