"""Imports run one way, down the layers README's module map names: a module never imports one of a layer above its
own, lazily (inside a function) or not, and no module imports itself through others (a cycle: what the modules of
one layer share lives in a module below them), so the tree keeps telling the data flow."""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Top to bottom, as in README.md: cli -> commands -> service -> scaleout -> superhub, transport -> the shared modules
# of fedload/ -> what the agent's zipapp holds (feeder/, _tail.py, fedload/__init__.py, transforms/).
_LAYER_OF_PACKAGE = {"cli": 6, "__main__": 6, "commands": 5, "service": 4, "scaleout": 3, "superhub": 2, "transport": 2}
_SHARED, _AGENT = 1, 0
# The one import allowed upwards: where fedload is installed, the agent logs through its structlog setup; the zipapp,
# which lacks it, falls back to the standard library (fedload/feeder/logs.py finds out which at run time).
_ALLOWED = {("fedload.feeder.logs", "fedload.log")}


def layer(module: str) -> int | None:
    """The layer of a module of fedload or transforms (higher imports lower); None for any other module."""
    parts = module.split(".")
    if parts[0] == "transforms" or module in ("fedload", "fedload._tail") or parts[:2] == ["fedload", "feeder"]:
        return _AGENT
    if parts[0] != "fedload":
        return None
    return _LAYER_OF_PACKAGE.get(parts[1], _SHARED)


def module_name(path: Path, root: Path) -> str:
    """`fedload.superhub.swap` for fedload/superhub/swap.py, `fedload.superhub` for its __init__.py."""
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def is_module(name: str, root: Path) -> bool:
    """Whether `name` is a module or package under `root` (not a name defined in one)."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported(path: Path, root: Path) -> Iterator[tuple[str, int]]:
    """Every module `path` imports (at any depth of the file, under TYPE_CHECKING too), with its line: `from A import
    B` imports A, and B too where B is a module; a relative import is resolved against `path`'s package."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if node.module:
                yield module, node.lineno
            names = (f"{module}.{alias.name}" for alias in node.names)
            yield from ((name, node.lineno) for name in names if is_module(name, root))


def _sources(root: Path) -> list[Path]:
    return sorted([*root.glob("fedload/**/*.py"), *root.glob("transforms/**/*.py")])


def upward_imports(root: Path = ROOT) -> list[str]:
    """`module imports other (line N)` for each import of a higher layer's module."""
    found = []
    for path in _sources(root):
        module = module_name(path, root)
        mine = layer(module)
        for name, line in imported(path, root):
            other = layer(name)
            if mine is not None and other is not None and other > mine and (module, name) not in _ALLOWED:
                found.append(f"{module} imports {name} (line {line})")
    return sorted(set(found))


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of fedload/ and transforms/ -> the modules of theirs it imports (lazily, or only for typing, too)."""
    graph = {module_name(path, root): {name for name, _ in imported(path, root)} for path in _sources(root)}
    return {module: names & graph.keys() - {module} for module, names in graph.items()}


def import_cycles(graph: Mapping[str, set[str]]) -> list[str]:
    """`a -> b -> a` for the shortest cycle through each module that has one, each cycle once (from its first
    module in sorted order)."""
    found = set()
    for module in sorted(graph):
        path = _shortest_path(graph, module)
        if path is not None:
            first = path.index(min(path))
            found.add(" -> ".join([*path[first:], *path[:first], min(path)]))
    return sorted(found)


def _shortest_path(graph: Mapping[str, set[str]], start: str) -> list[str] | None:
    """The modules from `start` along imports back to `start` (excluded at the end), fewest first; None if none."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for name in sorted(graph.get(module, ())):
            if name == start:
                path = [module]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return path[::-1]
            if name not in came_from:
                came_from[name] = module
                queue.append(name)
    return None


def test_no_module_imports_a_layer_above_its_own() -> None:
    """Every module of fedload/ and transforms/, every import in it: none reaches a higher layer."""
    assert upward_imports() == []


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    """The check itself can fail: a superhub module that imports the service (lazily, inside a function) is named."""
    (tmp_path / "fedload" / "superhub").mkdir(parents=True)
    (tmp_path / "fedload" / "superhub" / "swap.py").write_text(
        "from fedload import errors\n\n\ndef f() -> None:\n    from fedload.service import sync\n"
    )
    (tmp_path / "fedload" / "service").mkdir()
    (tmp_path / "fedload" / "service" / "sync.py").write_text("")
    assert upward_imports(tmp_path) == [
        "fedload.superhub.swap imports fedload.service (line 5)",
        "fedload.superhub.swap imports fedload.service.sync (line 5)",
    ]


def test_no_import_cycle() -> None:
    """No module of fedload/ and transforms/ imports itself through others, lazily or for typing alone."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_an_import_cycle_is_found(tmp_path: Path) -> None:
    """The check itself can fail: two feeder modules that import each other (one lazily, one relatively) and a
    three-module cycle in the superhub are each named once, with their path."""
    _write_tree(
        tmp_path,
        {
            "fedload/feeder/agent.py": "from fedload.feeder import binary_dump\n",
            "fedload/feeder/binary_dump.py": "def f() -> None:\n    from .agent import run\n",
            "fedload/feeder/wire.py": "from fedload.feeder.agent import run\n",
            "fedload/superhub/importer.py": "from fedload.superhub.statistics import Collector\n",
            "fedload/superhub/statistics.py": "import fedload.superhub.swap\n",
            "fedload/superhub/swap.py": "from fedload.superhub import importer\n",
        },
    )
    assert import_cycles(import_graph(tmp_path)) == [
        "fedload.feeder.agent -> fedload.feeder.binary_dump -> fedload.feeder.agent",
        "fedload.superhub.importer -> fedload.superhub.statistics -> fedload.superhub.swap"
        " -> fedload.superhub.importer",
    ]


def _write_tree(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
