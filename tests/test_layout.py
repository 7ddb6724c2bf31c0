"""The package's layout rules: what may import what, one list of schemes, short functions."""

from __future__ import annotations

import ast
import os
import re

import pytest
from test_imports import import_graph, imported_names, module_files

from psframework.schemes import scheme_names

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "psframework")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 600
MAX_CLASS_LINES = 300


def python_files(folder: str = PACKAGE):
    for base, _, names in os.walk(folder):
        for name in sorted(names):
            if name.endswith(".py"):
                yield os.path.join(base, name)


def source(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


# The package's layers, bottom first: a part (a top-level module, or a subpackage as a whole) imports only
# parts of the layers below its own. "" is the package's own __init__ (psframework.train_module).
LAYERS = (
    ("errors", "environment", "arrays", "fileio", "cliparse"),  # the ground: any layer may import these
    ("imports", "codes", "comm", "metrics", "rundir", "sweepindex"),
    ("config", "data", "models"),
    ("runtime",),
    ("settings",),
    ("schemes", "doctor"),
    ("report_runs",),
    ("report_labels", "report_plots"),
    ("api", "launch", "report", "config_reference"),
    ("netcluster",),
    ("sweep", "bench", "", "api_reference"),
    ("plan",),
    ("cli",),
    ("__main__",),
)


def part_of(module: str) -> str:
    """Return the part a module belongs to: the name after psframework. up to the next dot."""
    return module.split(".")[1] if "." in module else ""


def test_each_layer_imports_only_the_layers_below_it():
    layer = {part: level for level, parts in enumerate(LAYERS) for part in parts}
    graph = import_graph()
    unplaced = sorted({part_of(m) for m in graph} - set(layer))
    assert not unplaced, f"parts on no layer of LAYERS (place each one): {unplaced}"
    upward = [f"{module} -> {target}" for module, targets in sorted(graph.items()) for target in sorted(targets)
              if part_of(target) != part_of(module) and layer[part_of(target)] >= layer[part_of(module)]]
    assert not upward, "imports of a part on the same or a higher layer:\n" + "\n".join(upward)


@pytest.mark.parametrize("package,banned", [("codes", ("mpi4py", "torch.nn")), ("comm", ("torch.nn",))])
def test_codes_see_no_mpi_and_neither_codes_nor_comm_see_torch_nn(package, banned):
    for module, path in module_files().items():
        if module.startswith(f"psframework.{package}"):
            names = imported_names(module, path)
            taken = sorted(n for n in names if any(n == b or n.startswith(b + ".") for b in banned))
            assert not taken, f"{module} imports {taken}"


@pytest.mark.parametrize("package", ["codes", "comm"])
def test_codes_and_comm_never_see_the_config(package):
    for path in python_files(os.path.join(PACKAGE, package)):
        assert "Config" not in source(path), f"{path} mentions Config"
        assert "psframework.settings" not in source(path), f"{path} imports the settings"


def test_scheme_names_are_written_only_in_the_registry():
    names = [n for n in scheme_names() if n != "reference"]
    pattern = re.compile("|".join(f"[\"']{re.escape(n)}[\"']" for n in names))
    registry = os.path.join(PACKAGE, "schemes", "registry.py")
    offenders = [os.path.relpath(p, ROOT) for p in python_files() if p != registry and pattern.search(source(p))]
    assert not offenders, f"scheme names written outside the registry: {offenders}"


def test_no_function_is_longer_than_60_lines_outside_report_rendering():
    long = []
    for path in python_files():
        for node in ast.walk(ast.parse(source(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("render"):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, long


def test_no_file_is_longer_than_600_lines_and_no_class_longer_than_300():
    long = []
    for path in python_files():
        text, where = source(path), os.path.relpath(path, ROOT)
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            long.append(f"{where} ({lines} lines)")
        for node in ast.walk(ast.parse(text)):
            size = node.end_lineno - node.lineno + 1 if isinstance(node, ast.ClassDef) else 0
            if size > MAX_CLASS_LINES:
                long.append(f"{where}:{node.lineno} class {node.name} ({size} lines)")
    assert not long, long


def repository_files():
    """Yield every Python file of the package, the tests, the scripts and the examples."""
    for folder in ("psframework", "tests", "hpc", "examples"):
        yield from python_files(os.path.join(ROOT, folder))


def test_config_error_is_imported_from_errors_only():
    found = []
    for path in repository_files():
        for node in ast.walk(ast.parse(source(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("config") and \
                    "ConfigError" in [alias.name for alias in node.names]:
                found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert not found, f"ConfigError imported from the config module (import it from psframework.errors): {found}"


def test_the_schemes_package_init_defines_no_function():
    tree = ast.parse(source(os.path.join(PACKAGE, "schemes", "__init__.py")))
    defined = [node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert not defined, f"psframework/schemes/__init__.py defines {defined} (the entry point is schemes/entry.py)"


SETTINGS_CLASSES = {"Settings", "RunSettings", "OptimSettings", "ScheduleSettings", "CodeSettings", "StragglerSpec",
                    "TransportSettings"}


def test_settings_are_built_with_keyword_arguments():
    found = []
    for path in repository_files():
        for node in ast.walk(ast.parse(source(path))):
            name = getattr(node, "func", None)
            name = getattr(name, "id", None) or getattr(name, "attr", None)
            if isinstance(node, ast.Call) and name in SETTINGS_CLASSES and node.args:
                found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {name}")
    assert not found, f"settings built with positional arguments: {found}"


def test_the_registry_lists_every_scheme_with_loadable_sides():
    from psframework.schemes import get_scheme

    assert set(scheme_names()) >= {"reference", "ps", "stanza", "sazd", "sazd-naive", "poly", "uncoded"}
    for name in scheme_names():
        scheme = get_scheme(name)
        assert scheme.load(scheme.server) is not None
        assert (scheme.worker is None) == (not scheme.mpi)
        if scheme.worker:
            assert scheme.load(scheme.worker) is not None
        if scheme.byte_model:
            assert callable(scheme.load(scheme.byte_model))


def test_the_documented_example_scheme_is_the_tested_one():
    page = source(os.path.join(ROOT, "docs", "adding-a-scheme.md"))
    section = page.split("# Adding a scheme", 1)[1]
    example = section.split("```python", 1)[1].split("```", 1)[0]
    assert "register(Scheme(" in example and "class AverageServer(ServerSide)" in example
    toy = {line.strip() for line in source(os.path.join(ROOT, "tests", "mpi", "toy_scheme.py")).splitlines()}
    shown = [line.split("  #")[0].strip() for line in example.splitlines()]
    missing = [line for line in shown if line and line != "..." and not line.startswith(("...", "#"))
               and line not in toy]
    assert not missing, f"docs/adding-a-scheme.md lines not in tests/mpi/toy_scheme.py: {missing}"
