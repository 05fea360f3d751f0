"""The layering rules a reader relies on, checked from the source (no import runs).

- The package is grouped by concern: at most 8 modules at its root, every other module in a subpackage, and
  the subpackages in one declared order (``LAYERS``): a module imports only from its own layer or one declared
  before it, never up the list.
- No file over 600 lines, no function over 120: each can be read in one sitting.
- No import cycle inside ``qwenvl_rbln``; an import inside a function counts, because it binds the two
  modules just the same and makes the order they can be changed in a puzzle.
- Command modules hold options, one core call and rendering: at most 300 lines, and no core module
  imports one; only views, commands and the CLI wiring touch a terminal.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "qwenvl_rbln"
MAX_FUNCTION_LINES = 120
MAX_COMMAND_FILE_LINES = 300
MAX_FILE_LINES = 600
MAX_ROOT_MODULES = 8  # besides __init__ and __main__

# The one declared order, lowest first: a module may import from its own layer or an earlier one, never a later.
# docs/development.md's "Where things live" lists the packages in this order.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("qwenvl_rbln", "qwenvl_rbln.errors", "qwenvl_rbln.paths", "qwenvl_rbln.progress", "qwenvl_rbln.units"),
    ("qwenvl_rbln.planning",),
    ("qwenvl_rbln.artifacts",),
    ("qwenvl_rbln.memory",),
    ("qwenvl_rbln.vision",),
    ("qwenvl_rbln.backends",),
    ("qwenvl_rbln.inference",),
    ("qwenvl_rbln.jobs",),
    ("qwenvl_rbln.batch",),
    ("qwenvl_rbln.evaluation",),
    ("qwenvl_rbln.serving",),
    ("qwenvl_rbln.tuning",),
    ("qwenvl_rbln.profiling",),
    ("qwenvl_rbln.deploy",),
    ("qwenvl_rbln.views",),
    ("qwenvl_rbln.commands",),
    ("qwenvl_rbln.cli", "qwenvl_rbln.entry", "qwenvl_rbln.__main__", "qwenvl_rbln.vllm_plugin"),
)


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``package`` (a package is named by its __init__)."""
    files = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> set[str]:
    """The package modules one import statement names, the same for every spelling.

    ``import a.b`` and ``from a import b`` (b a submodule) both name module ``a.b``; ``from a import f`` (f
    defined in ``a/__init__.py``) names ``a``. The package ``__init__`` Python runs before any of its
    submodules is not counted: every submodule needs it, so it orders nothing a reader could change.
    """
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = module.split(".") if is_package else module.split(".")[:-1]
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join(anchor + ([node.module] if node.module else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    return {name for name in names if name in known and name != module}


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its source (top level, functions, TYPE_CHECKING)."""
    files = module_files(package)
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(module, path.name == "__init__.py", node, known)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component)


def test_no_import_cycle_inside_the_package():
    graph = import_graph(PACKAGE)
    assert len(graph) > 40, "the scan found too few modules to be looking at the package"
    found = cycles(graph)
    assert not found, "import cycles: " + " | ".join(_describe(graph, c) for c in found)


def test_the_cycle_scan_sees_function_level_and_relative_imports(tmp_path):
    """The scan itself: cycles closed by an import inside a function, a relative import, ``import a.b`` or a name
    from a package ``__init__`` are found; a submodule imported through its package is not mistaken for one."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import thing\n")
    (pkg / "sub" / "c.py").write_text("from . import d\n")
    (pkg / "sub" / "d.py").write_text("from ..sub.c import x\n")
    (pkg / "e.py").write_text("import pkg.a\n")  # into a cycle, not part of one
    (pkg / "f.py").write_text("import pkg.g\n")
    (pkg / "g.py").write_text("def h():\n    import pkg.f\n")
    for name, init, member in (
        ("lib", "from pkg.lib.x import helper\n", "from pkg.lib import y\n"),  # y is a submodule: no cycle
        ("lib2", "from pkg.lib2.z import q\nVALUE = 1\n", "def q():\n    from pkg.lib2 import VALUE\n"),
    ):
        (pkg / name).mkdir()
        (pkg / name / "__init__.py").write_text(init)
        (pkg / name / ("x.py" if name == "lib" else "z.py")).write_text(member)
    (pkg / "lib" / "y.py").write_text("")
    found = cycles(import_graph(pkg))
    assert sorted(found) == [
        ["pkg.a", "pkg.b"],
        ["pkg.f", "pkg.g"],
        ["pkg.lib2", "pkg.lib2.z"],
        ["pkg.sub.c", "pkg.sub.d"],
    ]


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> int | None:
    """The index of the declared layer holding ``module`` (a layer entry names a module or a whole package)."""
    root = layers[0][0]
    for index, members in enumerate(layers):
        for member in members:
            if module == member or (member != root and module.startswith(member + ".")):
                return index
    return None


def upward_imports(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Every import that runs up the declared order, as 'importer (layer) -> imported (layer)'."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            here, there = layer_of(module, layers), layer_of(target, layers)
            if here is not None and there is not None and there > here:
                found.append(f"{module} ({layers[here][0]}) -> {target} ({layers[there][0]})")
    return found


def package_graph(graph: dict[str, set[str]], files: dict[str, Path]) -> dict[str, set[str]]:
    """Package -> the other packages its modules import, at every depth; a root module stands for itself."""

    def package(module: str) -> str:
        owner = module if files[module].name == "__init__.py" else module.rsplit(".", 1)[0]
        return module if owner == PACKAGE.name else owner

    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = packages.setdefault(package(module), set())
        edges |= {package(t) for t in targets} - {package(module)}
    return packages


def test_no_cycle_between_packages_at_any_depth():
    """LAYERS orders the top-level packages; a nested one (planning/lm, backends/rbln) may not loop with its
    parent's modules either, or the folder would hide an order the code does not have."""
    packages = package_graph(import_graph(PACKAGE), module_files(PACKAGE))
    assert len(packages) > 15, "the scan found too few packages"
    assert not cycles(packages), f"package cycles: {cycles(packages)}"


def test_every_module_sits_in_a_declared_layer():
    unplaced = sorted(m for m in import_graph(PACKAGE) if layer_of(m) is None)
    assert not unplaced, f"add these to LAYERS (or move them into a package that is there): {unplaced}"


def test_no_import_runs_up_the_declared_layers():
    found = upward_imports(import_graph(PACKAGE))
    assert not found, "imports up the layer order: " + "; ".join(found)


def test_the_layer_check_finds_an_upward_import():
    layers = (("pkg", "pkg.base"), ("pkg.low",), ("pkg.high",))
    graph = {
        "pkg.base": set(),
        "pkg.low.a": {"pkg.base", "pkg.low.b"},  # down and sideways: fine
        "pkg.low.b": {"pkg.high.c"},  # up: found
        "pkg.high.c": {"pkg.low.a", "pkg"},
    }
    assert upward_imports(graph, layers) == ["pkg.low.b (pkg.low) -> pkg.high.c (pkg.high)"]
    assert layer_of("pkg.lower.x", layers) is None  # a prefix match needs the dot


def test_the_package_root_stays_small():
    root = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in {"__init__.py", "__main__.py"})
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the package root: {root}; move some into a package"


def test_no_file_is_too_long_to_read_in_one_sitting():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_FILE_LINES:
            too_long.append(f"{path.relative_to(PACKAGE.parent)} ({lines} lines)")
    assert not too_long, f"split by concern (<= {MAX_FILE_LINES} lines): " + ", ".join(too_long)


def test_serving_asks_the_artifact_layer_never_a_backend():
    """Whether an artifact is emulated, complete or current is the artifact layer's answer (manifest, layout,
    graph markers); the vllm-rbln hand-off never reaches into a backend (vLLM's plugin loads the packed ViT
    forward by name, at run time, in vLLM's own process)."""
    graph = import_graph(PACKAGE)
    reach = {
        module: sorted(t for t in targets if t.startswith("qwenvl_rbln.backends"))
        for module, targets in graph.items()
        if module.startswith("qwenvl_rbln.serving")
    }
    assert not {m: t for m, t in reach.items() if t}


def test_views_read_progress_never_reach_into_a_backend_or_the_inference_runner():
    """A view shows state it is handed: the compile's stages and the work events come from ``qwenvl_rbln.progress``
    (below every layer), never from a backend or the inference code that does the work."""
    graph = import_graph(PACKAGE)
    reach = {
        module: sorted(t for t in targets if t.startswith(("qwenvl_rbln.backends", "qwenvl_rbln.inference")))
        for module, targets in graph.items()
        if module.startswith("qwenvl_rbln.views")
    }
    assert not {m: t for m, t in reach.items() if t}


IMPORT_BY_NAME = ("import_module", "__import__")  # importlib.import_module("a.b"), __import__("a.b")
# Packages that never reach into qwenvl_rbln.backends, however they spell the import.
NEVER_A_BACKEND = ("qwenvl_rbln.serving", "qwenvl_rbln.views")


def imports_by_name(path: Path) -> set[str]:
    """The module names a file imports through a string literal (``import_module``/``__import__``): the imports
    ``import_graph`` cannot see, such as a plugin's lazy one."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        first = node.args[0]
        if called in IMPORT_BY_NAME and isinstance(first, ast.Constant) and isinstance(first.value, str):
            names.add(first.value)
    return names


def test_the_by_name_scan_sees_import_module_and_dunder_import(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text(
        "import importlib\nfrom importlib import import_module\n"
        "def f():\n    importlib.import_module('pkg.backends.a')\n    import_module('pkg.b')\n"
        "    __import__('pkg.c')\n    importlib.util.find_spec('pkg.d')\n    print('pkg.e')\n"
    )
    assert imports_by_name(mod) == {"pkg.backends.a", "pkg.b", "pkg.c"}


def test_serving_reaches_no_backend_even_by_a_module_name():
    """A static import and a name handed to ``import_module`` are the same dependency: the vLLM plugin's
    composition of serving and the packed ViT forward lives in the top layer (``qwenvl_rbln/vllm_plugin.py``)."""
    graph = import_graph(PACKAGE)
    offenders = []
    for module, path in module_files(PACKAGE).items():
        if not module.startswith(NEVER_A_BACKEND):
            continue
        reached = set(graph[module]) | imports_by_name(path)
        backends = sorted(t for t in reached if t == "qwenvl_rbln.backends" or t.startswith("qwenvl_rbln.backends."))
        if backends:
            offenders.append(f"{module} -> {', '.join(backends)}")
    assert not offenders, "move the composition up to the top layer: " + "; ".join(offenders)


def test_core_modules_never_import_a_command_module():
    graph = import_graph(PACKAGE)
    offenders = {
        module: sorted(t for t in targets if t.startswith("qwenvl_rbln.commands."))
        for module, targets in graph.items()
        if not module.startswith("qwenvl_rbln.commands") and module not in {"qwenvl_rbln.cli", "qwenvl_rbln.entry"}
    }
    assert not {m: t for m, t in offenders.items() if t}


PRESENTATION = (
    "qwenvl_rbln.__main__",
    "qwenvl_rbln.cli",
    "qwenvl_rbln.entry",
    "qwenvl_rbln.views",
    "qwenvl_rbln.commands",
)
TERMINAL_LIBRARIES = ("rich", "typer", "click")


def _external_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_core_never_imports_a_terminal():
    """Only commands, views (render and every rich view) and the CLI wiring may touch rich/typer or the renderer:
    a core function returns data, so a script, a test or vLLM's plugin can call it without a console."""
    graph = import_graph(PACKAGE)
    files = module_files(PACKAGE)
    offenders = []
    for module, path in files.items():
        if module.startswith(PRESENTATION):
            continue
        terminal = _external_imports(path) & set(TERMINAL_LIBRARIES)
        views = {t for t in graph[module] if t.startswith(PRESENTATION)}
        if terminal or views:
            offenders.append(f"{module}: {sorted(terminal | views)}")
    assert not offenders, offenders


@pytest.mark.parametrize("path", sorted((PACKAGE / "commands").glob("*.py")), ids=lambda p: p.name)
def test_command_files_stay_thin(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_COMMAND_FILE_LINES, f"{path.name}: {lines} lines; move logic into a core module"


def test_no_function_is_too_long_to_hold_in_one_head():
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({length} lines)")
    assert not too_long, "split into named steps: " + ", ".join(too_long)


def _layout_map() -> str:
    """docs/development.md's "Where things live" block (moved there from the README)."""
    doc = (PACKAGE.parent / "docs" / "development.md").read_text(encoding="utf-8")
    layout = doc[doc.index("Where things live") :]
    return layout[: layout.index("```", layout.index("```") + 3)]


def test_the_layout_map_names_every_root_module_and_package():
    """The developer page's map of the package must not fall behind the package."""
    layout = _layout_map()
    unnamed = [
        path.name
        for path in sorted(PACKAGE.glob("*.py"))
        if path.name not in {"__init__.py", "__main__.py"} and path.name not in layout
    ]
    subpackages = [p.name for p in sorted(PACKAGE.iterdir()) if (p / "__init__.py").is_file()]
    unnamed += [f"{name}/" for name in subpackages if f"{name}/" not in layout]
    assert not unnamed, f"docs/development.md 'Where things live' does not name: {unnamed}"


def test_the_layout_map_lists_the_packages_in_the_declared_order():
    layout = _layout_map()
    names = [member.partition(".")[2] for members in LAYERS for member in members]
    packages = [f"{name}/" for name in names if name and (PACKAGE / name).is_dir()]
    positions = [layout.index("\n" + name) for name in packages]
    assert positions == sorted(positions), f"docs/development.md lists the packages out of LAYERS order: {packages}"


def test_vision_never_asks_the_memory_planner():
    """Vision is pure maths (geometry, buckets, packing, the bucket-plan arithmetic): the plan's memory verdicts
    and figures are asked by a higher layer (``jobs.bucket_plan_job``) and handed down, never imported here."""
    graph = import_graph(PACKAGE)
    offenders = {
        module: sorted(t for t in targets if t == "qwenvl_rbln.memory" or t.startswith("qwenvl_rbln.memory."))
        for module, targets in graph.items()
        if module == "qwenvl_rbln.vision" or module.startswith("qwenvl_rbln.vision.")
    }
    assert not {m: t for m, t in offenders.items() if t}, offenders
