"""The paper's evaluation suite (Table 2): its tasks and where their data is found (``tasks``), the fine-tuning
protocol run task by task (``suite``), and the table of results (``table``)."""

from .suite import BUDGETS, run_transfer
from .table import group_means, table_row
from .tasks import SUITES, TASKS, VTAB_GROUPS, find_task

__all__ = ["BUDGETS", "SUITES", "TASKS", "VTAB_GROUPS", "find_task", "group_means", "run_transfer", "table_row"]
