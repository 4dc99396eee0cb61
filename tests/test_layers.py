"""The layering of vitkit, checked on its import graph (ast over src/vitkit, imports that run: those under
``if TYPE_CHECKING:`` are left out, those inside functions are not), and the absence of import cycles between
any two of its modules (an import inside a function is no way around one):

    leaf utilities <- models <- checkpoints <- {data, train, evaluate, analysis, benchmark, memory, serve} <- cli

A leaf utility is a top-level module that imports no other module of ours but leaf utilities (errors,
normalization, atomic, runtime ...). ``data`` imports only leaf utilities; the other packages of its tier may
import one another, without a cycle. Nothing imports cli but ``python -m vitkit``.
"""

import ast
import collections
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "vitkit"
TIERS = {"models": 1, "checkpoints": 2, "vitkit": 3, "data": 3, "train": 3, "evaluate": 3, "analysis": 3,
         "benchmark": 3, "memory": 3, "transfer": 3, "serve": 3, "text": 3, "cli": 4, "__main__": 5}  # "vitkit": the package's own __init__ (the public API)
LEAF_ONLY = {"models", "data"}  # besides the leaf utilities, which import only each other


def unit(module: str) -> str:
    """The layer a dotted module name belongs to: its top-level package or module under vitkit."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "vitkit"


def file_unit(path: Path, root: Path) -> str:
    return unit(".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"))


def runtime_imports(path: Path, root: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names taken from it) of every import of ours in a file, skipping ``if TYPE_CHECKING:``
    blocks (``import a.b`` takes no name)."""
    package = list(path.relative_to(root.parent).parts[:-1])  # what a relative import starts from
    found = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, ()) for alias in node.names
                         if alias.name.split(".")[0] == root.name)
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            if node.level:
                base = package[:len(package) - node.level + 1] + ([node.module] if node.module else [])
                found.append((node.lineno, ".".join(base), names))
            elif node.module and node.module.split(".")[0] == root.name:
                found.append((node.lineno, node.module, names))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def layering_violations(root: Path) -> list[str]:
    """Every import against the layering, as 'file:line imports module: why'."""
    edges = [(path, line, file_unit(path, root), unit(module), module)
             for path in sorted(root.rglob("*.py")) for line, module, _ in runtime_imports(path, root)]
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


def module_name(path: Path, root: Path) -> str:
    return ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of ours that importing it runs: each module it imports (``from pkg import sub``
    runs ``pkg.sub``), and the packages above one that it is not itself inside (``from ..data.splits import x``
    in train/run.py runs data/__init__.py first)."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        for _, target, names in runtime_imports(path, root):
            while target not in paths:  # ``from vitkit.x import name``'s module, whichever part is a file
                target = target.rsplit(".", 1)[0]
            submodules = {f"{target}.{name}" for name in names if f"{target}.{name}" in paths}
            targets = submodules | ({target} if len(submodules) < max(1, len(names)) else set())
            for found in targets:
                parts = found.split(".")
                above = {".".join(parts[:end]) for end in range(1, len(parts))}
                graph[module] |= {found} | {p for p in above if not (module == p or module.startswith(p + "."))}
    return graph


def shortest_circle(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The modules on a shortest way from ``start`` back to it (breadth first), or None when there is none."""
    paths, queue = {start: [start]}, collections.deque([start])
    while queue:
        module = queue.popleft()
        if start in graph[module]:
            return paths[module]
        for following in sorted(graph[module] - paths.keys()):
            paths[following] = paths[module] + [following]
            queue.append(following)
    return None


def import_cycles(root: Path) -> list[str]:
    """The circles of imports among the modules under ``root``, each as 'a -> b -> a': a shortest one through
    each module not yet named in one."""
    graph, cycles, named = import_graph(root), [], set()
    for start in sorted(graph):
        circle = None if start in named else shortest_circle(graph, start)
        if circle:
            cycles.append(" -> ".join([*circle, start]))
            named |= set(circle)
    return cycles


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


def test_no_module_of_vitkit_is_in_an_import_cycle():
    assert import_cycles(PACKAGE) == []


def test_the_cycle_check_names_each_circle_through_functions_and_packages(tmp_path):
    """A circle closed by an import inside a function, one closed through a package's __init__ (``from ..a.x``
    runs a/__init__.py, which imports b), and imports that close none: one line each for the first two."""
    root = tmp_path / "vitkit"
    files = {"__init__.py": "", "errors.py": "",
             "data/__init__.py": "from .front import load\n", "data/front.py": "from . import shards\n",
             "data/shards.py": "def f():\n    from .front import load\n", "data/images.py": "from ..errors import E\n",
             "a/__init__.py": "from .x import X\n", "a/x.py": "X = 1\n", "b.py": "from .a.x import X\n",
             "c/__init__.py": "", "c/y.py": "from ..a import x\nfrom .. import b\n"}
    files["a/__init__.py"] += "from .. import b\n"  # a -> b -> a (b runs a/__init__.py to reach a.x)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert import_cycles(root) == ["vitkit.a -> vitkit.b -> vitkit.a",
                                   "vitkit.data.front -> vitkit.data.shards -> vitkit.data.front"]


# What builds a model, a dataset or a loader: the command line calls the library functions that do (vitkit.load,
# checkpoints.runnable, evaluate.evaluate_dataset, ...), never these itself.
CONSTRUCTORS = {"create_model", "VisionTransformer", "build", "build_model", "read_checkpoint", "load_state_strict",
                "OnnxModel", "OpenVinoModel", "load_dataset", "load_splits", "DataLoader", "evaluation_loader",
                "training_loader", "eval_loader", "step_loader", "naflex_loader", "Trainer", "make_optimizer"}


def constructor_calls(root: Path) -> list[str]:
    """'file:line calls name' for every call of a CONSTRUCTORS name (bare or as an attribute) under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
        calls = [node for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.Call)]
        for node in sorted(calls, key=lambda call: call.lineno):
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name in CONSTRUCTORS:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} calls {name}")
    return found


def test_the_command_line_builds_no_model_and_no_data():
    assert constructor_calls(PACKAGE / "cli") == []


def test_the_constructor_check_names_the_call(tmp_path):
    root = tmp_path / "cli"
    root.mkdir()
    (root / "eval.py").write_text("from x import data\n\ndef run(args):\n    if args:\n"
                                  "        return data.load_dataset(args.name, 'test')\n    return create_model('ViT-B/16')\n")
    assert constructor_calls(root) == ["cli/eval.py:5 calls load_dataset", "cli/eval.py:6 calls create_model"]
