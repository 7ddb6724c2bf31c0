"""The link seam is used one way: a scheme's sides call only what comm/links.py declares, and write nothing into it.

Read from the source: in every class that is a server or worker side (a subclass of driver.ServerSide or
WorkerSide) and every function or class given a parameter typed ServerLink or WorkerLink, each member
taken from the link must be declared by that Protocol; outside comm/, nothing assigns to an attribute of
a link.
"""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Dict, Iterator, List, Optional, Set

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "psframework"
PROTOCOLS = ("ServerLink", "WorkerLink")
SIDES = {"ServerSide": "ServerLink", "WorkerSide": "WorkerLink"}


def declared(source: str) -> Dict[str, Set[str]]:
    """Return the members each link Protocol declares (annotated attributes and methods)."""
    members: Dict[str, Set[str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name in PROTOCOLS:
            members[node.name] = {item.target.id for item in node.body if isinstance(item, ast.AnnAssign)} | \
                {item.name for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return members


def side_kinds(trees: Dict[str, ast.Module]) -> Dict[str, str]:
    """Return {class name: the Protocol of its link} for every side class of the package (by inheritance)."""
    bases = {node.name: [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
             for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}

    def kind(name: str, seen: frozenset = frozenset()) -> Optional[str]:
        if name in SIDES:
            return SIDES[name]
        found = (kind(base, seen | {name}) for base in bases.get(name, []) if base not in seen)
        return next((k for k in found if k), None)

    return {name: k for name in bases if (k := kind(name))}


def annotated_protocol(annotation: Optional[ast.expr]) -> Optional[str]:
    """Return the link Protocol an annotation names (ServerLink, Optional[WorkerLink], "ServerLink"), if any."""
    text = "" if annotation is None else ast.unparse(annotation)
    return next((p for p in PROTOCOLS if re.search(rf"\b{p}\b", text)), None)


def link_parameters(function: ast.AST) -> Dict[str, str]:
    """Return {parameter name: Protocol} for a function's parameters typed with a link Protocol."""
    args = function.args.args + function.args.kwonlyargs  # type: ignore[attr-defined]
    return {a.arg: p for a in args if (p := annotated_protocol(a.annotation))}


def uses(node: ast.AST, name: str, through_self: bool) -> Iterator[ast.Attribute]:
    """Yield every `name.member` (or `self.name.member`) attribute taken under `node`."""
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Attribute):
            continue
        value = sub.value
        if through_self and isinstance(value, ast.Attribute) and value.attr == name and \
                isinstance(value.value, ast.Name) and value.value.id == "self":
            yield sub
        elif not through_self and isinstance(value, ast.Name) and value.id == name:
            yield sub


def undeclared(trees: Dict[str, ast.Module], members: Dict[str, Set[str]]) -> List[str]:
    """Return 'file:line: Protocol.member' for every link member used but not declared."""
    kinds = side_kinds(trees)
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            checks = []  # (subtree, name, through self, Protocol)
            if isinstance(node, ast.ClassDef):
                init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
                protocol = kinds.get(node.name) or (init and link_parameters(init).get("link"))
                if protocol:
                    checks.append((node, "link", True, protocol))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                checks += [(node, name, False, p) for name, p in link_parameters(node).items()]
            for subtree, name, through_self, protocol in checks:
                found += [f"{path}:{use.lineno}: {protocol}.{use.attr}" for use in uses(subtree, name, through_self)
                          if use.attr not in members[protocol]]
    return sorted(set(found))


def writes_into_links(trees: Dict[str, ast.Module]) -> List[str]:
    """Return 'file:line: target' for every assignment to an attribute of something named link."""
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and \
                            re.search(r"(^|\.)link$", ast.unparse(sub.value)):
                        found.append(f"{path}:{node.lineno}: {ast.unparse(sub)}")
    return found


def package_trees(outside_comm: bool = True) -> Dict[str, ast.Module]:
    """Return the parsed modules of the package (those outside comm/ by default)."""
    return {str(p.relative_to(PACKAGE.parent)): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))
            if not (outside_comm and p.relative_to(PACKAGE).parts[0] == "comm")}


def protocols() -> Dict[str, Set[str]]:
    return declared((PACKAGE / "comm" / "links.py").read_text())


def test_every_link_member_a_side_uses_is_declared_by_its_protocol():
    assert undeclared(package_trees(), protocols()) == []


def test_nothing_outside_comm_writes_into_a_link():
    assert writes_into_links(package_trees()) == []


def test_the_links_implement_their_protocols():
    from psframework.comm.server_link import MPIServerLink
    from psframework.comm.worker_link import MPIWorkerLink, ShardedWorkerLink

    members = protocols()
    for cls, protocol in ((MPIServerLink, "ServerLink"), (MPIWorkerLink, "WorkerLink"),
                          (ShardedWorkerLink, "WorkerLink")):
        source = ast.parse(pathlib.Path(__import__(cls.__module__, fromlist=["x"]).__file__).read_text())
        body = next(n for n in source.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
        has = {n.name for n in body.body if isinstance(n, ast.FunctionDef)} | \
            {t.attr for n in ast.walk(body) if isinstance(n, (ast.Assign, ast.AnnAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) for t in ast.walk(t)
             if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
        assert members[protocol] - has == set(), f"{cls.__name__} lacks what {protocol} declares"


SNIPPET = '''
from psframework.comm.links import ServerLink, WorkerLink

class Side(WorkerSide):
    def step(self):
        self.link.take(None)
        self.link.undeclared_member()

class Exchange:
    def __init__(self, link: ServerLink):
        self.link = link
    def round(self):
        return self.link.secret

def helper(link: "Optional[WorkerLink]"):
    link.hidden = 1
    return link.take(None), link.other
'''


def test_the_checks_find_an_undeclared_member_and_a_write_into_a_link():
    trees = {"snippet.py": ast.parse(SNIPPET)}
    members = {"ServerLink": {"send"}, "WorkerLink": {"take"}}
    assert undeclared(trees, members) == ["snippet.py:13: ServerLink.secret", "snippet.py:16: WorkerLink.hidden",
                                          "snippet.py:17: WorkerLink.other",
                                          "snippet.py:7: WorkerLink.undeclared_member"]
    assert writes_into_links(trees) == ["snippet.py:16: link.hidden"]


def test_no_link_group_or_exchange_is_typed_any():
    pattern = re.compile(r"(link|group|exchange)\s*:\s*Any")
    hits = [f"{p.relative_to(PACKAGE.parent)}:{i}" for p in sorted(PACKAGE.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_relay_is_named_only_by_its_dissemination_strategy_among_the_schemes():
    strategy = PACKAGE / "schemes" / "coded" / "dissemination.py"
    hits = [f"{p.relative_to(PACKAGE.parent)}:{i}" for p in sorted((PACKAGE / "schemes").rglob("*.py")) if p != strategy
            for i, line in enumerate(p.read_text().splitlines(), 1) if "relay" in line.lower()]
    assert hits == []
