"""The layering of vitkit, checked on its import graph (ast over src/vitkit, imports that run: those under
``if TYPE_CHECKING:`` are left out, those inside functions are not):

    leaf utilities <- models <- checkpoints <- {data, train, evaluate, analysis, benchmark, memory} <- cli

A leaf utility is a top-level module that imports no other module of ours but leaf utilities (errors,
normalization, atomic, runtime ...). ``data`` imports only leaf utilities; the other packages of its tier may
import one another, without a cycle. Nothing imports cli but ``python -m vitkit``.
"""

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "vitkit"
TIERS = {"models": 1, "checkpoints": 2, "vitkit": 3, "data": 3, "train": 3, "evaluate": 3, "analysis": 3,
         "benchmark": 3, "memory": 3, "transfer": 3, "cli": 4, "__main__": 5}  # "vitkit": the package's own __init__ (the public API)
LEAF_ONLY = {"models", "data"}  # besides the leaf utilities, which import only each other


def unit(module: str) -> str:
    """The layer a dotted module name belongs to: its top-level package or module under vitkit."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "vitkit"


def file_unit(path: Path, root: Path) -> str:
    return unit(".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"))


def runtime_imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of ours in a file, skipping ``if TYPE_CHECKING:`` blocks."""
    package = list(path.relative_to(root.parent).parts[:-1])  # what a relative import starts from
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == root.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1] + ([node.module] if node.module else [])
                found.append((node.lineno, ".".join(base)))
            elif node.module and node.module.split(".")[0] == root.name:
                found.append((node.lineno, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def layering_violations(root: Path) -> list[str]:
    """Every import against the layering, as 'file:line imports module: why'."""
    edges = [(path, line, file_unit(path, root), unit(module), module)
             for path in sorted(root.rglob("*.py")) for line, module in runtime_imports(path, root)]
    edges = [edge for edge in edges if edge[2] != edge[3]]
    units = {file_unit(path, root) for path in root.rglob("*.py")}
    leaves = {u for u in units if u not in TIERS}
    changed = True
    while changed:  # a leaf utility imports leaf utilities only
        not_leaves = {source for _, _, source, target, _ in edges if source in leaves and target not in leaves}
        leaves -= not_leaves
        changed = bool(not_leaves)
    problems = [f"{root.name}/{u}.py imports more than leaf utilities: give it a place in TIERS"
                for u in sorted(units - leaves - set(TIERS))]
    for path, line, source, target, module in edges:
        where = f"{path.relative_to(root.parent)}:{line} imports {module}"
        tier = 0 if source in leaves else TIERS[source]
        target_tier = 0 if target in leaves else TIERS.get(target, 99)
        if source in LEAF_ONLY and target_tier:
            problems.append(f"{where}: {source} may import only leaf utilities ({', '.join(sorted(leaves))})")
        elif target_tier > tier or (target_tier == tier and tier not in (0, 3)):  # leaves and peers: same tier
            problems.append(f"{where}: {source} (tier {tier}) may import only lower tiers, not {target} "
                            f"(tier {target_tier})")
    peers: dict[str, set[str]] = {}
    for _, _, source, target, _ in edges:
        if TIERS.get(source) == TIERS.get(target) == 3:
            peers.setdefault(source, set()).add(target)
    try:
        graphlib.TopologicalSorter(peers).prepare()
    except graphlib.CycleError as error:
        problems.append(f"a cycle of imports in the middle tier: {' <- '.join(error.args[1])}")
    return problems


def test_vitkit_keeps_its_layers():
    assert layering_violations(PACKAGE) == []


def test_the_check_names_the_offending_import(tmp_path):
    root = tmp_path / "vitkit"
    files = {"__init__.py": "", "errors.py": "", "models/__init__.py": "from ..errors import E\n",
             "data/__init__.py": "import typing\nif typing.TYPE_CHECKING:\n    from ..models import M\n",
             "data/transforms.py": "def f():\n    from ..models.config import ViTConfig\n",
             "evaluate/__init__.py": "from ..cli import main\n", "cli.py": "from .data import x\n",
             "train/__init__.py": "import vitkit.analysis\n", "analysis/__init__.py": "from ..train import run\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert layering_violations(root) == [
        "vitkit/data/transforms.py:2 imports vitkit.models.config: data may import only leaf utilities (errors)",
        "vitkit/evaluate/__init__.py:1 imports vitkit.cli: evaluate (tier 3) may import only lower tiers, not cli "
        "(tier 4)",
        "a cycle of imports in the middle tier: analysis <- train <- analysis",
    ]
