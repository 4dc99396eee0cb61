"""The ``vitkit`` command line: parsing, printing and exit statuses only; what a command does is a library
function (``vitkit.evaluate.evaluate_dataset``, ``vitkit.benchmark.bench_checkpoint``, ...) that it calls.

One module a command (or a family of commands), each with ``register(sub)`` (its parser and flags), ``HELP``
(its description and examples) and ``run`` (the call and what it prints):

    main      the program: top-level parser (did-you-mean), COMMANDS in help order, errors -> exit statuses
    flags     what the commands share: flag types, CHECKPOINT/--set/--device flags, a run's defaults, tables
    models    models, info          convert   convert           analyze   analyze
    train     train, pretrain, finetune                         eval      eval
    fewshot   fewshot               transfer  transfer          data      data info/verify/convert
    predict   predict               bench     bench

A new command is a new module listed in ``main.COMMANDS``.
"""

from .flags import load_checkpoint
from .main import build_parser, main, program
from .train import recipe_from_args

__all__ = ["build_parser", "load_checkpoint", "main", "program", "recipe_from_args"]
