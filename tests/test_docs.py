"""The documentation: a README a newcomer reads in minutes, a site that builds with ``mkdocs build --strict``, renders
with every image in a browser and fetches nothing from the network, and a docstring on every public name."""

import argparse
import ast
import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser import CHROMIUM, NO_CHROMIUM, chromium

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vitkit"
# The public API: the package's exports and the __all__ of these modules (what docs/reference/api.md renders).
PUBLIC_MODULES = ("vitkit", "vitkit.models", "vitkit.checkpoints", "vitkit.train", "vitkit.data", "vitkit.evaluate",
                  "vitkit.analysis", "vitkit.transfer", "vitkit.text")


def documented_constants() -> set[str]:
    """Names assigned at the top of a vitkit module and followed by a string: an attribute docstring, which
    mkdocstrings shows (a constant has no ``__doc__`` of its own)."""
    names = set()
    for path in SRC.rglob("*.py"):
        body = ast.parse(path.read_text()).body
        for statement, following in zip(body, body[1:]):
            targets = statement.targets if isinstance(statement, ast.Assign) else \
                [statement.target] if isinstance(statement, ast.AnnAssign) else []
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant) \
                    and isinstance(following.value.value, str):
                names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


def public_names():
    """(qualified name, object) of every public name and every public method or property of a public class."""
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        yield module_name, module
        for name in module.__all__:
            value = getattr(module, name)
            yield f"{module_name}.{name}", value
            if inspect.isclass(value):
                for member, attribute in vars(value).items():
                    if member.startswith("_"):
                        continue
                    function = attribute.fget if isinstance(attribute, property) else \
                        getattr(attribute, "__func__", attribute)
                    if inspect.isfunction(function):
                        yield f"{module_name}.{name}.{member}", function


def test_every_public_name_has_a_docstring():
    constants = documented_constants()
    missing = []
    for qualified, value in public_names():
        if inspect.isclass(value) or inspect.isroutine(value) or inspect.ismodule(value):
            doc = (value.__doc__ or "").strip()
            # a dataclass without a docstring gets its signature as one: "Name(field: type, ...)"
            documented = bool(doc) and not (inspect.isclass(value) and doc.startswith(f"{value.__name__}("))
        else:
            documented = qualified.rsplit(".", 1)[1] in constants
        if not documented:
            missing.append(qualified)
    assert not missing, f"public names without a docstring: {', '.join(sorted(set(missing)))}"


def test_the_check_finds_a_name_without_a_docstring(monkeypatch):
    import vitkit

    def undocumented():
        pass

    monkeypatch.setattr(vitkit, "undocumented", undocumented, raising=False)
    monkeypatch.setattr(vitkit, "__all__", [*vitkit.__all__, "undocumented"])
    with pytest.raises(AssertionError, match="vitkit.undocumented"):
        test_every_public_name_has_a_docstring()


def test_readme_is_short_and_starts_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme) < 15_000
    assert "make run" in readme and "make test" in readme
    for link in re.findall(r"\]\(((?:docs/)?[\w/.-]+\.(?:md|png))\)", readme):
        assert (ROOT / link).is_file(), link


HISTORY = re.compile(r"this branch|earlier (?:presets|runs?)|no record kept|on (?:this|the same) tree|/work/|/home/|"
                     r"/tmp/|\bissue \d+|\bsession \d+|#\d{2,}\b|\bnot committed\b|\bcommit [0-9a-f]{7}|"
                     r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b|\b(?:before|after) this (?:sweep|change)\b|"
                     r"\bthe old preset\b|\bkept for the record\b|\bpreset now\b", re.IGNORECASE)


def test_user_facing_text_does_not_tell_its_history():
    texts = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "benchmarks" / "results").glob("*.md"))]
    found = [f"{path.relative_to(ROOT)}: {match.group(0)!r}" for path in texts
             for match in HISTORY.finditer(path.read_text())]
    assert not found, found


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as ``mkdocs build --strict`` writes it (any warning fails the build)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_site_has_the_api_and_every_subcommand(site):
    ids = set(re.findall(r'id="(vitkit[\w.]*)"', (site / "reference" / "api" / "index.html").read_text()))
    for name in ("vitkit.load", "vitkit.create_model", "vitkit.VisionTransformer", "vitkit.ViTConfig",
                 "vitkit.train.run.run", "vitkit.train.Recipe", "vitkit.train.Trainer", "vitkit.analysis.rollout"):
        assert name in ids, name
    shown = {identifier.rsplit(".", 1)[-1] for identifier in ids}
    missing = [f"{qualified}" for qualified, _ in public_names() if qualified.rsplit(".", 1)[-1] not in shown
               and qualified not in PUBLIC_MODULES]
    assert not missing, f"public names missing from the API reference: {missing}"
    from vitkit.cli import build_parser

    cli = (site / "reference" / "cli" / "index.html").read_text()
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, command in commands.items():
        assert f"<code>vitkit {name}</code>" in cli, name
        for action in command._actions:
            for flag in action.option_strings:
                assert flag in cli, f"vitkit {name} {flag}"
    assert "<code>vitkit data verify</code>" in cli
    assert "recipe: <code>0.001</code>" in cli or "recipe: <code>" in cli  # recipe flags show the field's default


def test_site_fetches_nothing_from_the_network(site):
    external = re.compile(r"""<(?:link|script|img|iframe)\b[^>]*?(?:href|src)=["']?(?:https?:)?//""", re.IGNORECASE)
    offenders = [f"{page.relative_to(site)}: {match.group(0)}" for page in site.rglob("*.html")
                 for match in external.finditer(page.read_text())]
    assert not offenders, offenders[:5]
    assert not any("fonts.googleapis" in path.read_text(errors="ignore") for path in site.rglob("*.css"))


# Counts the page's images and code blocks once everything has loaded; an image that failed to decode has no size.
PROBE = """<script>window.addEventListener("load", () => {
  const images = [...document.querySelectorAll("article img")];
  document.body.dataset.images = images.length;
  document.body.dataset.shown = images.filter(image => image.complete && image.naturalWidth > 0).length;
  document.body.dataset.code = document.querySelectorAll("article pre code").length;
});</script>"""




def rendered(tmp_path, page: Path) -> dict[str, int]:
    """The counts ``PROBE`` reports for ``page``, rendered in headless Chromium beside the original (same links)."""
    probed = page.with_name("probed.html")
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", probed.as_uri())
    body = re.search(r"<body[^>]*>", dom).group(0)
    return {key: int(value) for key, value in re.findall(r'data-(images|shown|code)="(\d+)"', body)}


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
@pytest.mark.parametrize("page", ["index.html", "guide/analysis/index.html"])
def test_page_renders_its_images_and_code_in_headless_chromium(site, tmp_path, page):
    counts = rendered(tmp_path, site / page)
    assert counts["images"] >= 1 and counts["shown"] == counts["images"], counts
    assert counts["code"] >= 2, counts
    shot = tmp_path / "page.png"
    chromium(tmp_path, "--window-size=1280,2000", f"--screenshot={shot}", (site / page).as_uri())
    assert shot.stat().st_size > 10_000

    # The check can fail: a page whose image is missing reports one image fewer shown.
    broken = site / page
    html = broken.read_text()
    figure = re.search(r'<img[^>]*src="([^"]+\.png)"', html).group(1)
    (broken.parent / figure).rename(broken.parent / (figure + ".away"))
    try:
        counts = rendered(tmp_path, broken)
    finally:
        (broken.parent / (figure + ".away")).rename(broken.parent / figure)
    assert counts["shown"] == counts["images"] - 1, counts


def test_every_command_help_reads_well_in_a_terminal():
    from vitkit.cli import build_parser

    parser = build_parser()
    commands = [("vitkit", parser)]
    for name, command in commands:
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                commands += [(f"{name} {sub}", choice) for sub, choice in action.choices.items()]
    assert len(commands) == 19  # vitkit, its 15 commands and data's 3, counted by hand from vitkit --help
    for name, command in commands:
        text = command.format_help()
        assert "``" not in text and ":func:" not in text, f"{name}: reStructuredText markup in its help"
        assert command.description and "\n" not in command.description, f"{name}: expected a one-line description"
    for name in ("train", "finetune", "eval", "predict", "convert", "analyze", "fewshot", "bench"):
        command = dict(commands)[f"vitkit {name}"]
        assert f"vitkit {name} " in command.format_help().split("examples:" if "examples:" in
                                                                 (command.epilog or "") else "example:")[-1], name


def test_api_reference_shows_no_sphinx_roles(site):
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "PatchBatch" in api and not re.search(r":(?:class|func|meth):", api)


def undocumented_modules(root: Path) -> list[str]:
    """Every module under ``root`` whose docstring is missing or whose first line is empty (the line that says
    what the module is for)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
        if not doc or not doc.splitlines()[0].strip():
            found.append(str(path.relative_to(root.parent)))
    return found


def test_every_module_says_what_it_is_for():
    assert undocumented_modules(SRC) == []


def test_the_module_check_finds_a_missing_or_empty_docstring(tmp_path):
    root = tmp_path / "vitkit"
    files = {"__init__.py": '"""The package."""\n', "bare.py": "x = 1\n", "blank.py": '"""\nSays it late."""\n',
             "sub/kept.py": '"""A module.\n\nMore."""\n', "sub/__init__.py": "# a comment is no docstring\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    assert undocumented_modules(root) == ["vitkit/bare.py", "vitkit/blank.py", "vitkit/sub/__init__.py"]


ARCHITECTURE = ROOT / "docs" / "architecture.md"
FILE_PATH = re.compile(r"\bsrc/vitkit/[\w/]+\.py\b")
DOTTED = re.compile(r"(?<![\w/.-])vitkit(?:\.[A-Za-z_]\w*)+")


def is_module(parts: list[str]) -> bool:
    """Whether ``vitkit.x.y`` (as its parts) is a module of the source tree: a file or a package."""
    path = ROOT / "src" / Path(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def missing_names(text: str) -> list[str]:
    """The ``src/vitkit/...py`` paths and ``vitkit.x.y`` names in ``text`` that do not exist: a path must be a
    file; a dotted name, a module (file or package) of vitkit, or a name defined in the module it starts with."""
    missing = [path for path in sorted(set(FILE_PATH.findall(text))) if not (ROOT / path).is_file()]
    for name in sorted(set(DOTTED.findall(text))):
        parts = name.split(".")
        depth = max(end for end in range(1, len(parts) + 1) if is_module(parts[:end]))
        value = importlib.import_module(".".join(parts[:depth]))
        for part in parts[depth:]:
            value = getattr(value, part, None)
        if value is None:
            missing.append(name)
    return missing


def test_the_architecture_page_names_only_what_exists():
    text = ARCHITECTURE.read_text()
    assert missing_names(text) == []
    assert "architecture.md" in (ROOT / "mkdocs.yml").read_text()
    from test_layers import TIERS

    unnamed = [package for package in TIERS if package not in ("vitkit", "__main__") and f"{package}" not in text]
    assert not unnamed, f"packages of tests/test_layers.py's TIERS not drawn in docs/architecture.md: {unnamed}"


def test_the_name_check_finds_a_path_or_module_that_is_gone():
    text = ("`src/vitkit/cli/main.py`, `src/vitkit/cli.py`, `vitkit.train.trainer.Trainer`, `vitkit.load`, "
            "`vitkit.data.datasets.load_splits`, `vitkit.train.loop2`, `vitkit.checkpoints.loading.nothing`")
    assert missing_names(text) == ["src/vitkit/cli.py", "vitkit.checkpoints.loading.nothing", "vitkit.train.loop2"]
