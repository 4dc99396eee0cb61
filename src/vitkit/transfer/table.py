"""The suite's table as the paper's Table 2 lays it out: one row per way of measuring (fine-tuned, few-shot),
a column for each dataset (ImageNet's ReaL beside it), VTAB-1k's three group means and its mean; then VTAB-1k's
two averages, each said for what it is: the mean of the tasks (the ViT paper's) and of the group means (the
PEFT papers')."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .tasks import TASKS, VTAB_GROUPS, VTAB_PREFIX

REAL = "imagenet-real"  # the column of ImageNet's ReaL top-1
TRAINED = "trained (% of params)"  # the row of each task's trained share of the parameters, under the fine-tuned row


def group_means(accuracies: Mapping[str, float]) -> dict[str, tuple[float, int]]:
    """VTAB-1k's group means and its mean (over the tasks, as the paper's VTAB number is, not over the groups)
    of the tasks measured in ``accuracies`` (task -> accuracy): column -> (mean, tasks averaged)."""
    means = {}
    for group, names in VTAB_GROUPS.items():
        found = [accuracies[VTAB_PREFIX + name] for name in names if VTAB_PREFIX + name in accuracies]
        if found:
            means[f"vtab-{group}"] = (sum(found) / len(found), len(found))
    every = [value for name, value in accuracies.items() if TASKS[name].vtab]
    if every:
        means["vtab"] = (sum(every) / len(every), len(every))
    return means


def vtab_averages(accuracies: Mapping[str, float]) -> dict[str, float | int] | None:
    """VTAB-1k's two averages of the tasks measured in ``accuracies`` (None where none is VTAB-1k's), with how many
    tasks and groups each averages: the mean of the tasks (``group_means``' ``vtab``, the ViT paper's VTAB figure)
    and the mean of the natural, specialized and structured group means, which weighs each group alike whatever its
    number of tasks: the average the VTAB-1k PEFT papers report (NOAH's and FacT's, vitkit.transfer.tasks)."""
    means = group_means(accuracies)
    if "vtab" not in means:
        return None
    groups = [means[f"vtab-{group}"][0] for group in VTAB_GROUPS if f"vtab-{group}" in means]
    return {"mean_of_tasks": means["vtab"][0], "tasks": means["vtab"][1],
            "mean_of_groups": sum(groups) / len(groups), "groups": len(groups)}


def average_lines(averages: Mapping[str, Mapping[str, float | int]]) -> list[str]:
    """One line per row of the table with VTAB-1k tasks (``averages``: row -> ``vtab_averages``), its two VTAB-1k
    averages in %, each labelled with what it averages and whose figure it is."""
    tasks, groups = sum(map(len, VTAB_GROUPS.values())), len(VTAB_GROUPS)
    return [f"VTAB-1k {label}: {100 * found['mean_of_tasks']:.2f} as the mean of {of(found['tasks'], tasks)} tasks "
            f"(the ViT paper's VTAB, the table's column); {100 * found['mean_of_groups']:.2f} as the mean of "
            f"{of(found['groups'], groups)} group means (the PEFT papers' average, NOAH's and FacT's)"
            for label, found in averages.items()]


def of(count: int, whole: int) -> str:
    """``the 19`` where ``count`` is the ``whole``, else ``4 of the 19``."""
    return f"the {whole}" if count == whole else f"{count} of the {whole}"


def table_row(accuracies: Mapping[str, float], real: float | None = None) -> dict[str, float]:
    """One row of the table: each dataset outside VTAB-1k (``real``: ImageNet's ReaL top-1 beside ImageNet's),
    then VTAB-1k's group means and mean; accuracies as fractions of 1, in the order of ``TASKS``."""
    row = {}
    for name in TASKS:
        if name in accuracies and not TASKS[name].vtab:
            row[name] = accuracies[name]
            if name == "imagenet" and real is not None:
                row[REAL] = real
    row.update({column: mean for column, (mean, _) in group_means(accuracies).items()})
    return row


def column_title(column: str, counts: Mapping[str, int]) -> str:
    """A column's heading; a VTAB-1k mean over fewer tasks than the whole group says over how many."""
    if column in counts:
        group = column.removeprefix("vtab").strip("-")
        whole = len(VTAB_GROUPS[group]) if group else sum(map(len, VTAB_GROUPS.values()))
        title = f"VTAB {group}".strip()
        if counts[column] < whole:
            return f"{title} ({counts[column]} of {whole})"
        return title if group else f"{title} ({whole} tasks)"  # the ViT paper's heading
    return "ImageNet ReaL" if column == REAL else column


def markdown(rows: Mapping[str, Mapping[str, float]], counts: Mapping[str, int], vtab: Mapping[str, Mapping[str, float]]
             ) -> list[str]:
    """The table as markdown lines (accuracies in %, two decimals; a cell a row lacks is empty), then, where
    VTAB-1k tasks were run, a table of each of them."""
    lines = []
    for table in (rows, vtab):
        columns = list(dict.fromkeys(column for row in table.values() for column in row))
        if not columns:
            continue
        titles = [column_title(column, counts) for column in columns]
        lines += ["| | " + " | ".join(titles) + " |", "|---|" + "---:|" * len(columns)]
        lines += ["| " + " | ".join([label, *(f"{100 * row[c]:.2f}" if c in row else "" for c in columns)]) + " |"
                  for label, row in table.items()]
        lines.append("")
    return lines[:-1]


def report_lines(report: Mapping[str, Any]) -> list[str]:
    """The suite's report (``transfer.suite.suite_table``) as markdown lines: its tables, each with a row of its
    tasks' trained shares of the parameters under the fine-tuned row where the runs said them, then VTAB-1k's
    two averages of each row that has VTAB-1k tasks."""
    trained = report["trained"]
    rows = with_trained(report["rows"], {name: share for name, share in trained.items() if not TASKS[name].vtab})
    vtab = with_trained(report["vtab"], {name.removeprefix(VTAB_PREFIX): share for name, share in trained.items()
                                         if TASKS[name].vtab})
    averages = average_lines(report["vtab_averages"])
    return [*markdown(rows, report["counts"], vtab), *([""] + averages if averages else [])]


def with_trained(table: Mapping[str, Mapping[str, float]], shares: Mapping[str, float]
                 ) -> Mapping[str, Mapping[str, float]]:
    """``table`` with the ``TRAINED`` row of ``shares`` (column -> share) under its first row, where it has both."""
    if not table or not shares:
        return table
    first, *rest = table.items()
    return dict([first, (TRAINED, shares), *rest])
