"""Imports run one way, down the layers README's module map names: a module never imports one of a layer above its
own, lazily (inside a function) or not, so the tree keeps telling the data flow."""

from __future__ import annotations

import ast
from collections.abc import Iterator
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
    """Every module `path` imports (absolute imports, at any depth of the file), with its line: `from A import B`
    imports A, and B too where B is a module."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno
            names = (f"{node.module}.{alias.name}" for alias in node.names)
            yield from ((name, node.lineno) for name in names if is_module(name, root))


def upward_imports(root: Path = ROOT) -> list[str]:
    """`module imports other (line N)` for each import of a higher layer's module."""
    found = []
    for path in sorted([*root.glob("fedload/**/*.py"), *root.glob("transforms/**/*.py")]):
        module = module_name(path, root)
        mine = layer(module)
        for name, line in imported(path, root):
            other = layer(name)
            if mine is not None and other is not None and other > mine and (module, name) not in _ALLOWED:
                found.append(f"{module} imports {name} (line {line})")
    return sorted(set(found))


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
