"""The suite's import layering, read from the source with :mod:`ast` (nothing is imported).

Layers, lowest first::

    rescale_core  <-  rescale_tasks.common  <-  the task folders  <-  rescale_tasks.studies  <-  rescale_tasks.cli

and inside ``rescale_tasks.common`` (:data:`COMMON_LAYERS`), lowest first::

    errors  <-  system/  <-  data/  <-  training/  <-  checkpoints/  <-  reporting/  <-  run/  <-  module
            <-  cli/  <-  export/

An import may point down or stay inside its own package (or subpackage of ``common``), never up; the
task folders (classification, detection, translation, video) do not import each other (what two tasks
share lives in ``common``). ``benchmarks`` sits above everything and nothing imports it. A module or
subpackage of ``common`` missing from :data:`COMMON_LAYERS` is reported until it is given its layer.
The rules checked on top of the layers:

* no cycle between modules, counting imports made inside functions (a function-local import hides a
  cycle from Python, not from a reader);
* no name with a leading underscore taken from another first-party module (``from m import _x`` or
  ``m._x``);
* a first-party import inside a function carries a comment on its line or the line above saying why
  it is not at the top (an optional dependency, start-up time).

``python -m tools.layering`` prints the layers with their modules, the graph's cycles, the arrows that
break the layers, the private names and every function-local first-party import, and exits 1 when a
rule is broken; ``tests/test_layering.py`` asserts the same.
"""
from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parents[1]
# import name -> folder in the repository (``tasks/`` is installed as ``rescale_tasks``)
PACKAGES = {"rescale_core": "rescale_core", "rescale_tasks": "tasks", "benchmarks": "benchmarks"}
TASK_FOLDERS = ("classification", "detection", "translation", "video")
#: the sub-layers of ``tasks/common``, lowest first: a top-level module or a subpackage each (the
#: package's own ``__init__`` holds no import and sits with the lowest)
COMMON_LAYERS = ("errors", "system", "data", "training", "checkpoints", "reporting", "run", "module", "cli",
                 "export")
LAYERS = ("rescale_core", *(f"tasks/common/{name}" for name in COMMON_LAYERS), "task folders", "tasks/studies",
          "tasks/cli", "benchmarks")
_COMMON_FIRST = 1
_TASK_FOLDERS_LAYER = LAYERS.index("task folders")


@dataclass(frozen=True)
class Import:
    """One first-party import: ``source`` imports ``target`` (both module names) at ``path:line``."""

    source: str
    target: str
    path: str
    line: int
    local: bool  # inside a function body
    comment: str  # the comment on the import's lines or the line above ("" when none)
    private: tuple[str, ...]  # underscore names it takes from the target


@dataclass(frozen=True)
class PrivateUse:
    """``source`` reads ``target.name`` (a private name of another module) at ``path:line``."""

    source: str
    target: str
    name: str
    path: str
    line: int


def unit_of(module: str) -> tuple[int, str]:
    """The layer (an index into :data:`LAYERS`) and the package a module belongs to."""
    parts = module.split(".")
    if parts[0] == "rescale_core":
        return 0, "rescale_core"
    if parts[0] == "benchmarks":
        return len(LAYERS) - 1, "benchmarks"
    sub = parts[1] if len(parts) > 1 else ""
    if sub == "common":
        return _common_layer(parts[2] if len(parts) > 2 else None)
    if sub in TASK_FOLDERS:
        return _TASK_FOLDERS_LAYER, f"rescale_tasks.{sub}"
    if sub == "studies":
        return LAYERS.index("tasks/studies"), "rescale_tasks.studies"
    return LAYERS.index("tasks/cli"), "rescale_tasks"  # the command line and the (empty) package root


def _common_layer(name: str | None) -> tuple[int, str]:
    """The sub-layer of ``rescale_tasks.common.<name>``; the package itself and a name missing from
    :data:`COMMON_LAYERS` sit with the lowest, so an unplaced module shows as arrows up a layer."""
    if name in COMMON_LAYERS:
        return _COMMON_FIRST + COMMON_LAYERS.index(name), f"rescale_tasks.common.{name}"
    return _COMMON_FIRST, "rescale_tasks.common"


def unplaced(modules) -> list[str]:
    """Modules of ``rescale_tasks.common`` whose top-level name :data:`COMMON_LAYERS` does not list."""
    found = set()
    for module in modules:
        parts = module.split(".")
        if parts[:2] == ["rescale_tasks", "common"] and len(parts) > 2 and parts[2] not in COMMON_LAYERS:
            found.add(module)
    return sorted(found)


def discover(repo: Path = REPO) -> dict[str, Path]:
    """Every first-party module name -> its file."""
    modules = {}
    for name, folder in PACKAGES.items():
        for path in sorted((repo / folder).rglob("*.py")):
            rel = path.relative_to(repo / folder).with_suffix("").parts
            parts = [name, *rel]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found[tok.start[0]] = tok.string
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The first-party module ``name`` or its longest importable prefix; None when not first-party."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    """Every node with whether it sits inside a function body."""
    stack = [(tree, False)]
    while stack:
        node, local = stack.pop()
        yield node, local
        inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def scan(module: str, path: Path, modules: dict[str, Path],
         repo: Path = REPO) -> tuple[list[Import], list[PrivateUse]]:
    """The first-party imports of one module and the private names it reads through module aliases."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    comments = _comments(source)
    text = source.splitlines()
    rel = str(path.relative_to(repo))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    imports: list[Import] = []
    aliases: dict[str, str] = {}  # local name bound to a first-party module -> that module

    def note(node: ast.stmt, target: str, local: bool, private: tuple[str, ...] = ()) -> None:
        lines = list(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if node.lineno > 1 and text[node.lineno - 2].lstrip().startswith("#"):
            lines.insert(0, node.lineno - 1)  # a comment line right above
        comment = " ".join(comments[n] for n in lines if n in comments)
        imports.append(Import(module, target, rel, node.lineno, local, comment, private))

    nodes = list(_walk(tree))
    for node, local in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules)
                if target is None:
                    continue
                note(node, target, local)
                if alias.asname:
                    aliases[alias.asname] = target
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = _resolve(top, modules) or top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            if _resolve(origin, modules) is None:
                continue
            plain = []
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                if submodule in modules:  # ``from package import module``
                    note(node, submodule, local)
                    aliases[alias.asname or alias.name] = submodule
                else:
                    plain.append(alias.name)
            if plain:
                target = _resolve(origin, modules)
                note(node, target, local, tuple(n for n in plain if _private(n) and target != module))
    uses = []
    for node, _ in nodes:
        if isinstance(node, ast.Attribute) and _private(node.attr):
            head = _dotted(node.value)
            if head is None:
                continue
            first, _, rest = head.partition(".")
            if first not in aliases:
                continue
            target = ".".join(p for p in (aliases[first], rest) if p)
            if target in modules and target != module:
                uses.append(PrivateUse(module, target, node.attr, rel, node.lineno))
    return [i for i in imports if i.target != module], uses


@dataclass
class Report:
    """The import graph of the first-party code and what breaks the layering rules."""

    imports: list[Import]
    private_uses: list[PrivateUse]
    modules: list[str] = field(default_factory=list)  # every first-party module, importing or not

    def graph(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_edges_from((i.source, i.target) for i in self.imports)
        return g

    def cycles(self) -> list[list[str]]:
        """One cycle per strongly connected group of modules, each starting at its smallest name."""
        g = self.graph()
        found = []
        for group in nx.strongly_connected_components(g):
            if len(group) < 2:
                continue
            cycle = [a for a, _ in nx.find_cycle(g.subgraph(group), source=min(group))]
            found.append(cycle + [cycle[0]])
        return sorted(found)

    def wrong_way(self) -> list[Import]:
        """Imports that point up a layer, or sideways between two task folders."""
        bad = []
        for i in self.imports:
            (src_layer, src_unit), (dst_layer, dst_unit) = unit_of(i.source), unit_of(i.target)
            if dst_layer > src_layer or (dst_layer == src_layer == _TASK_FOLDERS_LAYER and src_unit != dst_unit):
                bad.append(i)
        return bad

    def private_imports(self) -> list[str]:
        found = [f"{i.path}:{i.line}  {i.source} takes {', '.join(i.private)} from {i.target}"
                 for i in self.imports if i.private]
        found += [f"{u.path}:{u.line}  {u.source} reads {u.target}.{u.name}" for u in self.private_uses]
        return sorted(set(found))

    def local_imports(self) -> list[Import]:
        return [i for i in self.imports if i.local]

    def unexplained_local_imports(self) -> list[Import]:
        return [i for i in self.local_imports() if not i.comment]

    def unplaced(self) -> list[str]:
        """Modules of ``rescale_tasks.common`` that no layer of :data:`COMMON_LAYERS` holds."""
        return unplaced(self.modules)

    def broken(self) -> bool:
        return bool(self.cycles() or self.wrong_way() or self.private_imports()
                    or self.unexplained_local_imports() or self.unplaced())

    def layer_lines(self) -> list[str]:
        """The layers, lowest first, each with its modules (``tasks/common``'s by name)."""
        members: dict[int, list[str]] = {}
        for module in sorted(set(self.modules) | {i.source for i in self.imports}):
            members.setdefault(unit_of(module)[0], []).append(module)
        width = max(map(len, LAYERS))
        out = ["layers, lowest first (an import points down or stays inside its own package):"]
        for index, name in enumerate(LAYERS):
            found = members.get(index, [])
            if name.startswith("tasks/common/"):  # a top-level module, or a subpackage's modules
                unit = f"rescale_tasks.common.{name.rpartition('/')[2]}"
                found = [m for m in found if m != "rescale_tasks.common"]  # the package root: no import
                shown = ", ".join(m.rpartition(".")[2] for m in ([m for m in found if m != unit] or found))
            else:
                shown = f"{len(found)} modules"
            out.append(f"  {name.ljust(width)}  {shown}")
        return out

    def lines(self) -> list[str]:
        out = [f"{len({i.source for i in self.imports})} modules, {len(self.imports)} first-party imports "
               f"({len(self.local_imports())} inside functions)", ""]
        out += self.layer_lines() + [""]
        missing = self.unplaced()
        out.append(f"modules of tasks/common in no layer (add them to COMMON_LAYERS): {len(missing)}")
        out += ["  " + m for m in missing]
        cycles = self.cycles()
        out.append(f"cycles: {len(cycles)}")
        out += ["  " + " -> ".join(c) for c in cycles]
        wrong = self.wrong_way()
        out.append(f"arrows up a layer or between task folders: {len(wrong)}")
        for i in wrong:
            out.append(f"  {i.path}:{i.line}  {i.source} -> {i.target}  "
                       f"({LAYERS[unit_of(i.source)[0]]} imports {LAYERS[unit_of(i.target)[0]]})")
        private = self.private_imports()
        out.append(f"private names across modules: {len(private)}")
        out += ["  " + p for p in private]
        local = self.local_imports()
        unexplained = self.unexplained_local_imports()
        out.append(f"first-party imports inside functions: {len(local)} ({len(unexplained)} without a comment)")
        for i in local:
            why = i.comment or "(no comment)"
            out.append(f"  {i.path}:{i.line}  {i.source} -> {i.target}  {why}")
        return out


def build(repo: Path = REPO) -> Report:
    """Parse every first-party module under ``repo``."""
    modules = discover(repo)
    imports, uses = [], []
    for module, path in modules.items():
        found, private = scan(module, path, modules, repo)
        imports += found
        uses += private
    imports.sort(key=lambda i: (i.path, i.line, i.target))
    uses.sort(key=lambda u: (u.path, u.line, u.name))
    return Report(imports, uses, sorted(modules))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.layering", description=__doc__.split("\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="repository root (default: this one)")
    args = parser.parse_args(argv)
    report = build(args.repo.resolve())
    print("\n".join(report.lines()))
    return 1 if report.broken() else 0


if __name__ == "__main__":
    sys.exit(main())
