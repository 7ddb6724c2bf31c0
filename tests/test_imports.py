"""The package's imports, read with ast: no import cycle, and no scheme that branches on the number of servers.

Every import counts: at module level, inside functions, under TYPE_CHECKING, relative ones resolved.
Imports made by importlib or __import__ (the benchmark and scheme tables) are not followed.
"""

from __future__ import annotations

import ast
import os
import re
from typing import Dict, Iterator, List, Optional, Set, Tuple


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "psframework"
# Where a topology is chosen: the registry, the driver-level assembly of a run's sides and its group objects.
TOPOLOGY_MODULES = ("registry.py", "entry.py", "topology.py")
SERVER_BRANCHES = re.compile(r"\bgroup is None\b|\bgroup is not None\b|\bshards == 1\b|\bacross is not None\b"
                             r"|\bacross is None\b|\bservers > 1\b|\bservers == 1\b|\bgroups > 1\b")


def module_files() -> Dict[str, str]:
    """Return {dotted module name: path} of every module of the package (a package by its __init__)."""
    found = {}
    for base, _, names in os.walk(os.path.join(ROOT, PACKAGE)):
        for name in sorted(names):
            if name.endswith(".py"):
                parts = os.path.relpath(os.path.join(base, name), ROOT)[:-3].split(os.sep)
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = os.path.join(base, name)
    return found


def imports(module: str, path: str) -> Iterator[Tuple[str, Optional[str]]]:
    """Yield (imported module, name taken from it or None) for every import statement of a module."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
            source = ".".join(filter(None, (base, node.module)))
            yield from ((source, alias.name) for alias in node.names)


def imported_names(module: str, path: str) -> Set[str]:
    """Return every dotted name a module imports: `import a.b` gives a.b, `from a import b` gives a and a.b."""
    names = set()
    for source, name in imports(module, path):
        names.update([source] if name is None else [source, f"{source}.{name}"])
    return names


def import_graph() -> Dict[str, Set[str]]:
    """Return {module: the package's modules it imports}; `from a import b` imports module a.b if there is one."""
    modules = module_files()
    graph: Dict[str, Set[str]] = {}
    for module, path in modules.items():
        graph[module] = set()
        for source, name in imports(module, path):
            target = f"{source}.{name}" if f"{source}.{name}" in modules else source
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != module:
                graph[module].add(target)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Return one cycle (its modules in import order, the first again at the end) per strongly connected group."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    groups: List[Set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the package is small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(graph, group) for group in groups]


def _cycle_through(graph: Dict[str, Set[str]], group: Set[str]) -> List[str]:
    """Return the shortest cycle inside `group` from its first module back to it (breadth first)."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target == start:
                    return paths[node] + [start]
                if target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # a strongly connected group always has one


def scheme_modules() -> Iterator[str]:
    """Yield the paths of the scheme modules that must not branch on the number of servers."""
    for base, _, names in os.walk(os.path.join(ROOT, PACKAGE, "schemes")):
        for name in sorted(names):
            if name.endswith(".py") and not (base.endswith("schemes") and name in TOPOLOGY_MODULES):
                yield os.path.join(base, name)


def test_the_graph_reads_every_kind_of_import():
    graph = import_graph()
    assert "psframework.comm.mailbox" in graph["psframework.comm.transport"]  # relative, module level
    assert "psframework.schemes.common" in graph["psframework.schemes.validate"]  # inside a function
    assert "psframework.comm.rounds" in graph["psframework.comm"]  # under TYPE_CHECKING
    assert "psframework.environment" in graph["psframework.cli"]  # `from psframework import environment`
    assert "psframework" not in graph["psframework.codes.threads"]  # ... is the module, not the package


def test_no_import_cycle_in_the_package():
    found = [" → ".join(cycle) for cycle in cycles(import_graph())]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_scheme_branches_on_the_number_of_servers():
    found = []
    for path in scheme_modules():
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if SERVER_BRANCHES.search(line):
                    found.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
    assert not found, "branches on the number of servers (a Group object belongs there):\n" + "\n".join(found)
