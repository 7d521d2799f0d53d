"""The suite's import layering: import-linter's contracts (``[tool.importlinter]`` in pyproject.toml)
and the rules they cannot state, checked on the import graph import-linter builds (grimp's) and the
source read with :mod:`ast` (nothing is imported).

Layers, highest first (an import points down or stays inside its own package, never up; the task
folders never import each other)::

    benchmarks  ->  rescale_tasks: __main__, cli  ->  studies  ->  task folders  ->  common  ->  rescale_core

and inside ``rescale_tasks.common``: export -> cli -> module -> run -> reporting -> checkpoints ->
training -> data -> system -> errors. A new module of ``rescale_tasks`` or ``rescale_tasks.common``
breaks its contract until the contract gives it a layer (``exhaustive``). On top of the contracts:

* no cycle between modules, counting imports made inside functions (a function-local import hides a
  cycle from Python, not from a reader);
* no name with a leading underscore taken from another first-party module (``from m import _x`` or
  ``m._x``);
* a first-party import inside a function carries a comment on its line or the line above saying why
  it is not at the top (an optional dependency, start-up time).

``python -m tools.layering`` prints the layers, runs the contracts (as ``lint-imports`` does) and the
three rules for the packages importable from the working folder, and exits 1 when one is broken;
``tests/test_layering.py`` runs it.
"""
from __future__ import annotations

import ast
import importlib.util
import io
import sys
import tokenize
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own dependency
    import tomli as tomllib

import grimp
from importlinter.cli import lint_imports

ROOTS = ("rescale_core", "rescale_tasks", "benchmarks")


def contracts(config: Path) -> list[dict]:
    """The import-linter contracts of a ``pyproject.toml``."""
    return tomllib.loads(config.read_text())["tool"]["importlinter"]["contracts"]


def layer_lines(config: Path) -> list[str]:
    """Each layers contract, its layers highest first."""
    out = []
    for contract in contracts(config):
        if contract["type"] == "layers":
            where = ", ".join(contract.get("containers", [])) or "packages"
            out.append(f"{where}: " + "  ->  ".join(contract["layers"]))
    return out


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """One cycle per pair of modules that import each other (directly or through others)."""
    found = set()
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                cycle = [module, *back]
                start = cycle.index(min(cycle[:-1]))
                found.add(tuple(cycle[start:-1] + cycle[:start + 1]))
    return [list(c) for c in sorted(found)]


def _comments(source: str) -> dict[int, str]:
    return {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def _first_party(name: str, modules: set[str]) -> str | None:
    """The first-party module ``name`` or its longest importable prefix; None when not first-party."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def source_faults(module: str, path: Path, modules: set[str]) -> list[str]:
    """The private names ``module`` takes from other first-party modules and its first-party
    imports inside functions without a comment, as ``path:line  what`` lines."""
    source = path.read_text()
    path = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    comments, lines, faults = _comments(source), source.splitlines(), []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    aliases: dict[str, str] = {}  # a name bound to a first-party module -> that module
    tree = ast.parse(source)
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, local = stack.pop()
        inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))
        first_party = False
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _first_party(alias.name, modules)
                if target:
                    first_party = True
                    aliases[alias.asname or alias.name.split(".")[0]] = target if alias.asname \
                        else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            origin = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                target = _first_party(f"{origin}.{alias.name}", modules)
                first_party = first_party or bool(target)
                if target == f"{origin}.{alias.name}":  # a module
                    aliases[alias.asname or alias.name] = target
                elif target and _private(alias.name) and target != module:
                    faults.append(f"{path}:{node.lineno}  {module} takes {alias.name} from {target}")
        if first_party and local:
            span = range(node.lineno, (node.end_lineno or node.lineno) + 1)
            above = lines[node.lineno - 2].lstrip().startswith("#") if node.lineno > 1 else False
            if not any(n in comments for n in span) and not above:
                faults.append(f"{path}:{node.lineno}  {module}: a first-party import inside a function without a "
                              "comment saying why")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                target = ".".join([aliases[value.id], *chain])
                if target in modules and target != module:
                    faults.append(f"{path}:{node.lineno}  {module} reads {target}.{node.attr}")
    return sorted(set(faults))


def files(modules: set[str]) -> dict[str, Path]:
    """Each module's file, found from its root package's folder (nothing is imported)."""
    folders = {root: Path(importlib.util.find_spec(root).origin).parent for root in ROOTS}
    out = {}
    for module in modules:
        root, *rest = module.split(".")
        path = folders[root].joinpath(*rest)
        out[module] = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the layers, run the contracts and the three rules; 1 when something is broken."""
    config = Path.cwd() / "pyproject.toml"
    print("layers, highest first:\n  " + "\n  ".join(layer_lines(config)) + "\n")
    broken = lint_imports(config_filename=str(config), no_cache=True) != 0
    graph = grimp.build_graph(*ROOTS, cache_dir=None)
    faults = [" -> ".join(c) for c in cycles(graph)]
    print(f"\nimport cycles between modules: {len(faults)}\n" + "".join(f"  {c}\n" for c in faults), end="")
    found = [fault for module, path in sorted(files(graph.modules).items())
             for fault in source_faults(module, path, graph.modules)]
    print(f"private names across modules, first-party imports inside functions without a reason: {len(found)}"
          + "".join(f"\n  {f}" for f in found))
    return 1 if broken or faults or found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
