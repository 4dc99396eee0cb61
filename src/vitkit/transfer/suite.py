"""The paper's transfer protocol run task by task (appendix B.1.1): the learning rate picked from table 4's
grid on a held-out part of the training split, then the final run on the whole of it, tested on the task's test
split; VTAB-1k at one setting for every task. Each task is a resumable sub-run in its own folder of the suite's:
a killed suite skips the tasks whose ``result.json`` is written and resumes the others at their last checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_file
from ..checkpoints.loading import load
from ..data import SplitSpec, evaluation_loader, load_dataset
from ..errors import ConfigError, DatasetError, parse_json
from ..evaluate.fewshot import DEFAULT_SHOTS, VALIDATION_PER_CLASS, extract_features, fewshot_evaluate
from ..evaluate.metrics import evaluate, real_top1
from ..evaluate.preprocessing import checkpoint_transform
from ..paths import own_folder, read_text
from ..runtime import select_device
from ..train.presets import merge, resolve
from ..train.recipes import Recipe
from ..train.run import run
from .table import group_means, report_lines, table_row, vtab_averages
from .tasks import (PEFT_BATCH, PEFT_DROP_PATH, PEFT_END_LR, PEFT_EPOCHS, PEFT_PROTOCOL, PEFT_SIZE, PEFT_WARMUP_EPOCHS,
                    PEFT_WEIGHT_DECAY, TASKS, Found, Task, expected_places, find_task, peft_protocol, suite_tasks)

SUITE_FILE, RESULT_FILE, SUMMARY_FILE = "suite.json", "result.json", "summary.json"
TABLE_JSON, TABLE_MARKDOWN = "transfer.json", "transfer.md"
# What a suite's folder holds besides SUITE_FILE (a folder of only these is a suite cut short): tasks, the table.
SUITE_ENTRIES = re.compile("|".join(map(re.escape, (*TASKS, TABLE_JSON, TABLE_MARKDOWN))))
REAL_FILE = "real.json"  # ImageNet's ReaL labels, looked for in the ImageNet folder when none are named
FEWSHOT_SEEDS = (0, 1, 2)
ZEROSHOT = "zero-shot"  # the row of each task's zero-shot top-1 (an image-text checkpoint's text tower)


@dataclass(frozen=True)
class Budget:
    """How much of the paper's protocol a suite runs: its fine-tuning resolution (None: the data's own size at
    the checkpoint's patch) and batch, its steps as a share of table 4's (at least ``min_steps``, at most
    ``max_steps``), and the note said on every line of a suite that is not the paper's protocol."""

    name: str
    image_size: int | None
    batch_size: int
    step_share: float = 1.0
    min_steps: int = 1
    max_steps: int | None = None
    note: str = ""

    def steps(self, task: Task) -> int:
        steps = max(self.min_steps, round(task.steps * self.step_share))
        return min(steps, self.max_steps) if self.max_steps else steps


BUDGETS = {
    "paper": Budget("paper", 384, 512),
    "small": Budget("small", None, 64, step_share=0.01, min_steps=10, max_steps=100,
                    note="[budget small: steps and resolution scaled down for a CPU, not the paper's protocol] "),
}
"""``paper``: appendix B.1.1 (384 px, batch 512, table 4's steps); ``small``: a hundredth of the steps (10 to
100), the data's own resolution, batch 64."""


def run_transfer(checkpoint: str, suite: Sequence[str], data_dir: str | Path, out: str | Path | None = None,
                 budget: str = "paper", fewshot: bool = False, finetune: bool = True,
                 real_labels: str | Path | None = None, device: str | None = None,
                 recipe: dict[str, Any] | None = None, peft: str | dict[str, Any] | None = None,
                 zeroshot: bool = False, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the transfer protocol of ``checkpoint`` on the tasks of ``suite`` (``paper``, ``vtab1k`` or task
    names, see ``transfer.tasks``) found under ``data_dir``, each in its own folder under ``out``; say which
    tasks of a suite are absent, and return the table (also written to ``out/transfer.json`` and
    ``out/transfer.md``) after saying it line by line. ``finetune=False`` evaluates the checkpoint as it is (its
    head must have each task's classes); ``fewshot`` adds the few-shot linear rows (appendix B.1.2) from the
    checkpoint's frozen representations; ``real_labels`` (default ``imagenet/real.json`` under ``data_dir``)
    adds ImageNet's ReaL top-1; ``recipe`` fields override every fine-tuning run's (e.g.
    ``schedule.accum_steps``). ``peft`` (a method, ``"lora"``, or the recipe's ``peft`` fields, ``{"method":
    "lora", "lora_rank": 4}``) fine-tunes every task with that method, VTAB-1k's at the PEFT papers' protocol
    (``transfer.tasks.PEFT_PROTOCOL``); the table says each task's trained share of the parameters. ``zeroshot``
    adds a zero-shot row: each task's test split classified by its class names and open_clip's 80 templates with
    the text tower of the image-text ``checkpoint`` (``vitkit zeroshot --dataset``); with ``finetune=False`` it is
    the only row measured (the image tower has no head to evaluate as it is). Run again with the same ``out``, it
    skips the finished tasks and resumes the others."""
    if budget not in BUDGETS:
        raise ConfigError(f"--budget {budget}: expected one of {', '.join(BUDGETS)}")
    chosen = BUDGETS[budget]
    note = chosen.note
    main = is_main()

    def tell(line: str) -> None:
        if main:  # under torchrun every rank trains; one speaks and writes
            say(note + line)

    root = Path(data_dir)
    if not root.is_dir():
        raise DatasetError(f"--data-dir {root}: not a folder (expected the folder holding the tasks' data)")
    given = {"method": peft} if isinstance(peft, str) else dict(peft or {})
    overrides = merge(nested_fields(recipe or {}), {"peft": given} if given else {})
    method = peft_method(checkpoint, overrides.get("peft", {}), finetune)
    if zeroshot:
        check_text_tower(checkpoint)  # before any task trains
    found, absent = present_tasks(suite, root)
    if method != "none":
        found = [replace(where, task=peft_protocol(where.task)) for where in found]
    if absent:
        tell(f"absent under {root}: {', '.join(absent)}")
    out = Path(out or f"runs/transfer-{time.strftime('%Y%m%d-%H%M%S')}")
    settings = {"checkpoint": str(checkpoint), "budget": budget, "finetune": finetune, "fewshot": fewshot,
                "recipe": recipe or {}}
    if given:  # as suite.json holds it (lists, not tuples), to compare with when the suite resumes
        settings["peft"] = parse_json(json.dumps(given))
    if zeroshot:  # only when asked, so that a suite begun before the option resumes as it was
        settings["zeroshot"] = True
    if main:
        start_suite(out, settings)
    tell(f"suite folder {out} (the same --out resumes it)")
    if method != "none":
        tell(f"peft {method}: {PEFT_PROTOCOL}")
    results = {}
    with noted_messages(note):
        for where in found:
            real = imagenet_real_labels(where, real_labels)
            results[where.task.name] = task_result(where, checkpoint, chosen, out / where.task.name, finetune,
                                                   fewshot, real, device, overrides, tell, zeroshot)
    if not main:
        return {}
    report = suite_table(results, settings, absent, note, method)
    with atomic_file(out / TABLE_JSON) as handle:
        json.dump(report, handle, indent=1)
    lines = report_lines(report)
    with atomic_file(out / TABLE_MARKDOWN) as handle:
        handle.write("\n".join([f"{note}transfer of {checkpoint}", "", *lines, ""]))
    for line in lines:
        tell(line)
    tell(f"table in {out / TABLE_MARKDOWN} and {out / TABLE_JSON}")
    return report


@contextlib.contextmanager
def noted_messages(note: str) -> Iterator[None]:
    """While the suite's runs go, every message vitkit logs (through the handlers of vitkit's logger and of the
    root logger) starts with ``note`` too, as the suite's own lines do: a budget other than the paper's is said
    on every line."""
    def prefixed(record: logging.LogRecord) -> bool:
        if record.name.startswith("vitkit") and not str(record.msg).startswith(note):
            record.msg = note + str(record.msg)
        return True

    handlers = [*logging.getLogger("vitkit").handlers, *logging.getLogger().handlers] if note else []
    for handler in handlers:
        handler.addFilter(prefixed)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(prefixed)


def peft_method(checkpoint: str, fields: dict[str, Any], finetune: bool) -> str:
    """The PEFT method of every fine-tuning run of the suite (``none``: full fine-tuning) from the recipe's
    ``peft`` ``fields``, checked as a run checks them; a ConfigError for a wrong field, for a method's settings
    without a method, and for a method without fine-tuning."""
    method = Recipe.from_dict({"model": {"init": str(checkpoint)}, "peft": fields}, "--peft").peft.method
    settings = sorted(set(fields) - {"method"})
    if method == "none" and settings:
        raise ConfigError(f"--peft: {', '.join(settings)} given without a method; expected --peft METHOD as well")
    if method != "none" and not finetune:
        raise ConfigError(f"--peft {method}: a method of fine-tuning; drop --no-finetune, or --peft")
    return method


def is_main() -> bool:
    """Whether this process is the one that measures, writes and speaks: rank 0 under torchrun, else the only one."""
    return int(os.environ.get("RANK", "0")) == 0


def present_tasks(suite: Sequence[str], root: Path) -> tuple[list[Found], list[str]]:
    """The tasks ``suite`` asks for that lie under ``root``, and the names of those that do not; a task named
    one by one must be there (a DatasetError naming where it was looked for), and so must one task of a suite."""
    tasks = suite_tasks(suite)
    found, absent = [], []
    for task, named in tasks.values():
        where = find_task(task, root)
        if where is None and named:
            raise DatasetError(f"task {task.name}: not under {root} (expected {expected_places(task, root)})")
        (found if where else absent).append(where or task.name)
    if not found:
        raise DatasetError(f"--suite {' '.join(suite)}: no task under {root}; expected folders such as "
                           f"{expected_places(next(iter(tasks.values()))[0], root)} (see vitkit.transfer.tasks)")
    return found, absent


def start_suite(out: Path, settings: dict[str, Any]) -> None:
    """Make ``out`` the suite's folder, or continue the suite it holds where that one has the same settings."""
    own_folder(out, SUITE_FILE, SUITE_ENTRIES, "a transfer suite", ConfigError)
    saved = out / SUITE_FILE
    if saved.is_file():
        before = parse_json(read_text(saved, "suite settings"))
        if before != settings:
            changed = sorted(key for key in {**before, **settings} if before.get(key) != settings.get(key))
            raise ConfigError(f"{out} holds a suite run with other settings ({', '.join(changed)}); continue it with "
                              f"the same ones or choose another --out")
        return
    out.mkdir(parents=True, exist_ok=True)
    with atomic_file(saved) as handle:
        json.dump(settings, handle, indent=1)


def imagenet_real_labels(where: Found, asked: str | Path | None) -> Path | None:
    """ImageNet's ReaL label file: the one asked for, else ``real.json`` in the ImageNet folder; None for
    another task or where there is none."""
    if where.task.name != "imagenet":
        return None
    if asked:
        return Path(asked)
    beside = Path(where.where) / REAL_FILE
    return beside if beside.is_file() else None


def task_result(where: Found, checkpoint: str, budget: Budget, folder: Path, finetune: bool, fewshot: bool,
                real: Path | None, device: str | None, recipe: dict[str, Any], tell: Callable[[str], None],
                zeroshot: bool = False) -> dict[str, Any]:
    """The numbers of one task (read back from its ``result.json`` where an earlier run finished it), written
    atomically once the task is done. Without fine-tuning a zero-shot suite measures the zero-shot row alone."""
    task = where.task
    done = folder / RESULT_FILE
    if done.is_file():
        result = parse_json(read_text(done, "task result"))
        tell(f"{task.name}: finished earlier, {accuracies_said(result)} (from {done})")
        return result
    tell(f"{task.name}: {where.spec} ({where.where})")
    result: dict[str, Any] = {"task": task.name, "dataset": where.spec, "data_dir": where.data_dir,
                              "test_split": task.test_split}
    if finetune:
        result.update(finetune_task(where, checkpoint, budget, folder, device, recipe, tell))
    if not is_main():  # the other ranks of torchrun's group take part in the training runs only
        return result
    if finetune:
        measured = folder / "final" / "model" if real else None
    else:
        measured = None if zeroshot else checkpoint
    if measured is not None:
        result.update(measure(where, measured, real, device))
    if fewshot:
        result["fewshot"] = fewshot_task(where, checkpoint, device)
    if zeroshot:
        result["zeroshot"] = zeroshot_task(where, checkpoint, device)
    images = result["images"] if "images" in result else result["zeroshot"]["images"]
    tell(f"{task.name}: {accuracies_said(result, 'top-1 ')} on {task.test_split} ({images} images)"
         + (f", ReaL top-1 {100 * result['real_top1']:.2f}%" if "real_top1" in result else "")
         + (f", {100 * result['trained_share']:.2f}% of the parameters trained" if "trained_share" in result else ""))
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(done) as handle:
        json.dump(result, handle, indent=1)
    return result


def accuracies_said(result: dict[str, Any], measure: str = "") -> str:
    """A task's top-1 and zero-shot top-1, those of them its ``result`` holds, in %, each after ``measure``."""
    said = [f"{measure}{100 * result['accuracy']:.2f}%"] if "accuracy" in result else []
    if "zeroshot" in result:
        said.append(f"zero-shot {measure}{100 * result['zeroshot']['accuracy']:.2f}%")
    return ", ".join(said)


def finetune_task(where: Found, checkpoint: str, budget: Budget, folder: Path, device: str | None,
                  recipe: dict[str, Any], tell: Callable[[str], None]) -> dict[str, Any]:
    """The protocol of one task: each learning rate of its grid trained on the training split less the
    held-out part and scored on that part, then the best one (the first of equals) trained on the whole
    training split and tested."""
    task = where.task
    sweep = {}
    if len(task.lrs) > 1:
        for lr in task.lrs:
            summary = sub_run(task_recipe(where, checkpoint, budget, lr, task.held_out, folder / f"lr-{lr:g}", recipe),
                              device)
            if summary.get("test/split") == "val":  # the dataset's own val split, not a part held out of training
                raise DatasetError(f"task {task.name}: {where.spec} measures its own val split, which it is tested "
                                   f"on, as the validation of the learning-rate runs; expected {task.held_out:.0%} "
                                   f"of {task.train_split} held out for them")
            if "val/accuracy" not in summary:
                raise DatasetError(f"task {task.name}: {where.spec} held out no validation images to pick the "
                                   f"learning rate on (expected {task.held_out:.0%} of {task.train_split})")
            sweep[f"{lr:g}"] = summary["val/accuracy"]
            tell(f"{task.name}: lr {lr:g}: {100 * sweep[f'{lr:g}']:.2f}% on {task.held_out:.0%} held out of "
                 f"{task.train_split}")
    lr = max(task.lrs, key=lambda value: sweep.get(f"{value:g}", 0.0))
    final = sub_run(task_recipe(where, checkpoint, budget, lr, 0.0, folder / "final", recipe), device)
    if final.get("test/split") != task.test_split:
        raise DatasetError(f"task {task.name}: {where.spec} was tested on its {final.get('test/split')} split; "
                           f"expected its {task.test_split} split")
    trained = {"trained": final["params/trained"], "params": final["params/total"],
               "trained_share": final["params/trained_share"]} if "params/trained_share" in final else {}
    return {"lr": lr, "sweep": sweep, "steps": final["steps"], "accuracy": final["test/accuracy"],
            "images": final["test/images"], **trained}


def task_recipe(where: Found, checkpoint: str, budget: Budget, lr: float, held_out: float, run_dir: Path,
                recipe: dict[str, Any]):
    """The recipe of one fine-tuning run of a task: ``paper-finetune`` at the task's steps and ``lr``, scaled by
    the ``budget``, with ``held_out`` of the training split kept for validation (a VTAB-1k task under a PEFT method,
    ``peft_protocol``'s, with the PEFT papers' other settings: ``peft_fields``), and ``recipe``'s overrides
    (``{"schedule": {"accum_steps": 8}}``, or ``{"schedule.accum_steps": 8}``)."""
    task = where.task
    steps = budget.steps(task)
    fields = {"model": {"init": str(checkpoint), "image_size": budget.image_size},
              "data": {"dataset": where.spec, "data_dir": where.data_dir, "train_split": task.train_split,
                       "val_fraction": held_out},
              "schedule": {"steps": steps, "batch_size": budget.batch_size},
              "optim": {"lr": lr}, "run": {"dir": str(run_dir)}}
    overrides = nested_fields(recipe)
    if task.vtab and overrides.get("peft", {}).get("method", "none") != "none":
        fields = merge(fields, peft_fields(budget, steps))
    return resolve("paper-finetune", overrides=merge(fields, overrides))


def peft_fields(budget: Budget, steps: int) -> dict[str, Any]:
    """The PEFT papers' settings of a VTAB-1k run of ``steps`` besides its steps and learning rate
    (``transfer.tasks``): AdamW without layer decay or clipping, batch 64, a tenth of the run warming up, cosine
    decay to 1e-5, stochastic depth, whole images resized to 224 px (to the data's own size where the ``budget``
    keeps it) without augmentation."""
    return {"model": {"image_size": PEFT_SIZE if budget.image_size else None, "args": {"drop_path": PEFT_DROP_PATH}},
            "augment": {"transform": "eval"},
            "optim": {"optimizer": "adamw", "weight_decay": PEFT_WEIGHT_DECAY, "layer_decay": None, "clip_norm": 0.0},
            "schedule": {"batch_size": PEFT_BATCH, "warmup_steps": steps * PEFT_WARMUP_EPOCHS // PEFT_EPOCHS,
                         "end_lr": PEFT_END_LR}}


def nested_fields(recipe: dict[str, Any]) -> dict[str, Any]:
    """Recipe overrides with dotted keys (``schedule.accum_steps``, as ``--recipe`` gives them) put in their
    sections; sections given whole are kept."""
    nested: dict[str, Any] = {}
    for key, value in recipe.items():
        section, dot, name = key.partition(".")
        if dot:
            nested.setdefault(section, {})[name] = value
        elif isinstance(value, dict):
            nested.setdefault(section, {}).update(value)
        else:
            raise ConfigError(f"--recipe {key}={value}: expected SECTION.FIELD=VALUE, such as "
                              f"schedule.accum_steps=8 (the sections of `vitkit train --help`)")
    return nested


def sub_run(recipe, device: str | None) -> dict[str, Any]:
    """A fine-tuning run's summary, as its ``summary.json`` holds it (every rank reads the one rank 0 wrote): run
    first unless it finished earlier, resumed from its last checkpoint where one was cut short."""
    summary = Path(recipe.run.dir) / SUMMARY_FILE
    if not summary.is_file():
        run(recipe, resume=True, device=device)
    return parse_json(read_text(summary, "run summary"))


def measure(where: Found, model_path: str | Path, real: Path | None, device: str | None) -> dict[str, Any]:
    """Top-1 of the model at ``model_path`` on the task's test split as it is (with ReaL top-1 where ``real``
    labels are given); a ConfigError naming the task when its head has another number of classes."""
    task = where.task
    on = select_device(device)
    model = load(model_path).to(on)
    dataset = load_dataset(where.spec, task.test_split, where.data_dir, SplitSpec(0.0))
    classes = model.config.num_classes
    if classes != len(dataset.classes):
        raise ConfigError(f"task {task.name}: {model_path} predicts {classes} classes but {where.spec} has "
                          f"{len(dataset.classes)}; expected a head of {len(dataset.classes)} classes to evaluate "
                          f"without fine-tuning")
    loader = evaluation_loader(dataset, checkpoint_transform(model.config), 256, device=on)
    evaluation = evaluate(model, loader, classes, on, keep_predictions=real is not None)
    result = {"accuracy": evaluation.top1, "images": evaluation.count}
    if real is not None:
        result.update(real_top1(evaluation, real, dataset, classes))
    return result


def fewshot_task(where: Found, checkpoint: str, device: str | None) -> dict[str, float]:
    """Few-shot linear accuracy (appendix B.1.2: least squares onto {-1, 1} targets from the frozen
    representations, regulariser chosen on held-out training examples) on the task's test split for each of
    the paper's shot counts its smallest class allows: shots -> mean over ``FEWSHOT_SEEDS``."""
    task = where.task
    on = select_device(device)
    model = load(checkpoint).to(on)
    features = {}
    for split in (task.train_split, task.test_split):
        dataset = load_dataset(where.spec, split, where.data_dir, SplitSpec(0.0))
        features[split] = extract_features(model, evaluation_loader(dataset, checkpoint_transform(model.config), 256,
                                                                    device=on), on)
    labels = features[task.train_split][1]
    smallest = int(np.bincount(labels).min())
    shots = [shot for shot in DEFAULT_SHOTS if shot + VALIDATION_PER_CLASS <= smallest]
    results = fewshot_evaluate(*features[task.train_split], *features[task.test_split], shots=shots,
                               seeds=FEWSHOT_SEEDS, num_classes=int(labels.max()) + 1) if shots else []
    return {str(result.shots): result.mean for result in results}


def check_text_tower(checkpoint: str) -> None:
    """Refuse, in one line naming the families that have one, a checkpoint without a text tower to classify by
    class names with, or without the tokenizer files it needs."""
    from ..text import load_clip

    load_clip(checkpoint)


def zeroshot_task(where: Found, checkpoint: str, device: str | None) -> dict[str, Any]:
    """Zero-shot top-1 of the image-text ``checkpoint`` on the task's test split, prompted as clip-benchmark prompts
    the task (its class names and templates where it has them; else the dataset's names and open_clip's 80
    templates): what ``vitkit zeroshot --dataset`` measures."""
    from ..text import load_clip
    from ..text.zeroshot import zeroshot_dataset

    on = select_device(device)
    report = zeroshot_dataset(load_clip(checkpoint).to(on), where.spec, where.task.test_split,
                              data_dir=where.data_dir, val_fraction=0.0, device=on, task=where.task.name)
    return {"accuracy": report["top1"], "top5": report["top5"], "images": report["images"]}


def suite_table(results: dict[str, dict[str, Any]], settings: dict[str, Any], absent: list[str], note: str,
                method: str = "none") -> dict[str, Any]:
    """The table of the suite's ``results`` (fine-tuned with the PEFT ``method``): a row of the fine-tuned (or
    as-is) accuracies, one per few-shot count, VTAB-1k's group means (with how many tasks each averages), each
    row's two VTAB-1k averages (``table.vtab_averages``), each task's trained share of the parameters where its
    run said it, a zero-shot row where the suite measured one, and a table of each VTAB-1k task (the first row's,
    and the zero-shot row's)."""
    accuracies = {name: result["accuracy"] for name, result in results.items() if "accuracy" in result}
    real = results.get("imagenet", {}).get("real_top1")
    label = "fine-tuned" if settings["finetune"] else "as is"
    zeroshot = {name: result["zeroshot"]["accuracy"] for name, result in results.items() if "zeroshot" in result}
    measured = {label: accuracies} if accuracies else {}
    if zeroshot:
        measured[ZEROSHOT] = zeroshot
    for shot in DEFAULT_SHOTS:
        shot_accuracies = {name: result["fewshot"][str(shot)] for name, result in results.items()
                           if str(shot) in result.get("fewshot", {})}
        if shot_accuracies:
            measured[f"{shot}-shot linear"] = shot_accuracies
    rows = {row: table_row(values, real if row == label else None) for row, values in measured.items()}
    averages = {row: found for row, values in measured.items() if (found := vtab_averages(values))}
    counts = {column: count for column, (_, count) in group_means(accuracies or zeroshot).items()}
    vtab = {row: {name.removeprefix("vtab-"): value for name, value in values.items() if TASKS[name].vtab}
            for row, values in measured.items() if row in (label, ZEROSHOT)}
    protocol = note.strip(" []") or "the paper's (appendix B.1.1)"
    return {**settings, "protocol": protocol + (f"; {PEFT_PROTOCOL}" if method != "none" else ""),
            "peft_method": method, "absent": absent, "rows": rows, "counts": counts, "vtab_averages": averages,
            "trained": {name: result["trained_share"] for name, result in results.items() if "trained_share" in result},
            "vtab": {row: values for row, values in vtab.items() if values}, "tasks": results}
