"""The suite's table as the paper's Table 2 lays it out: one row per way of measuring (fine-tuned, few-shot),
a column for each dataset (ImageNet's ReaL beside it), VTAB-1k's three group means and its mean."""

from __future__ import annotations

from collections.abc import Mapping

from .tasks import TASKS, VTAB_GROUPS, VTAB_PREFIX

REAL = "imagenet-real"  # the column of ImageNet's ReaL top-1


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
        title = f"VTAB {group}".strip() if group else "VTAB"
        return title if counts[column] == whole else f"{title} ({counts[column]} of {whole})"
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
