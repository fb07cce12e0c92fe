"""How far the whole configuration (`fedload.config.Config`) travels through fedload: a static measurement (AST).

    uv run python tools/config_reach.py [ROOT] [-v]

ROOT is a checkout (default: this one), so `tools/config_reach.py /path/to/other/checkout` measures another
revision with the same script. It prints:

- **parameters typed Config**: function parameters whose annotation names `Config` (`Config | None` and
  `Callable[[], Config]` too), per module, and the modules that import `Config`;
- **run_sync's config**: followed from `run_sync`'s `config` parameter (in `fedload.service.sync`, or in
  `fedload.commands.sync` where it moved) through the calls.
  A call that passes the value (the parameter, a name or `self.` attribute bound to it, or a `for_feeder`,
  `for_shard` or `model_copy` of it) as an argument is one hand-on; it reaches the callee's parameter when the
  callee is found (by name: a function of the module or imported from fedload, a class (its `__init__`), or any
  fedload method of that name whose matching parameter is annotated `Config` or not at all). Attributes read from
  it (`config.superhub`) are narrow values and not followed.

Name resolution is approximate (no types), the same for every revision, so the numbers compare.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

START = ("run_sync", "config")  # wherever it is defined: fedload/service/sync.py, later fedload/commands/sync.py
_COPIES = {"for_feeder", "for_shard", "model_copy"}  # methods of Config that return a whole Config
# Across the worker's socket: what the parent sends arrives as the worker's run's parameter.
_BRIDGES = {("fedload.service.workers", "_Worker.send"): ("fedload.service.worker", "_run", "config")}


@dataclass
class Function:
    module: str
    qualname: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: str | None  # the class it is a method of
    params: list[ast.arg] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return self.module, self.qualname


@dataclass
class Module:
    name: str
    tree: ast.Module
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # alias -> (module, name or None)
    functions: dict[str, Function] = field(default_factory=dict)  # qualname -> function
    classes: set[str] = field(default_factory=set)


def _names_config(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return "Config" in annotation.value.replace("|", " ").replace("[", " ").replace("]", " ").split()
    return any(isinstance(n, ast.Name) and n.id == "Config" for n in ast.walk(annotation))


def _load(root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((root / "fedload").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        module = modules[name] = Module(name, ast.parse(path.read_text(), filename=str(path)))
        _index(module, module.tree.body, prefix="", cls=None)
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedload"):
                for alias in node.names:
                    module.imports[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("fedload"):
                        module.imports[alias.asname or alias.name] = (alias.name, None)
    return modules


def _index(module: Module, body: list[ast.stmt], prefix: str, cls: str | None) -> None:
    for node in body:
        if isinstance(node, ast.ClassDef):
            module.classes.add(prefix + node.name)
            _index(module, node.body, f"{prefix}{node.name}.", node.name)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            function = Function(module.name, prefix + node.name, node, cls, params)
            module.functions[function.qualname] = function
            _index(module, node.body, f"{prefix}{node.name}.", None)


class Reach:
    """The fixpoint of where the start parameter's value flows."""

    def __init__(self, modules: dict[str, Module]) -> None:
        self.modules = modules
        self.tainted: set[tuple[str, str, str]] = {  # (module, qualname, parameter)
            (module.name, *START) for module in modules.values() if START[0] in module.functions
        }
        self.attributes: set[tuple[str, str, str]] = set()  # (module, class, attribute) bound to the value
        self.hand_ons: set[tuple[str, int, int]] = set()  # (module, line, column) of each passing call
        self.into: dict[tuple[str, int, int], str] = {}  # hand-on -> the module of its (first) callee
        self.methods: dict[str, list[Function]] = defaultdict(list)
        for module in modules.values():
            for function in module.functions.values():
                if function.cls is not None:
                    self.methods[function.node.name].append(function)

    def run(self) -> None:
        before = -1
        while before != len(self.tainted) + len(self.attributes):
            before = len(self.tainted) + len(self.attributes)
            for module in self.modules.values():
                for function in module.functions.values():
                    self._scan(module, function)

    def _scan(self, module: Module, function: Function) -> None:
        names = {p.arg for p in function.params if (module.name, function.qualname, p.arg) in self.tainted}
        names |= self._closure(module, function)
        if not names and not self._reads_attribute(module, function):
            return
        for _ in range(3):  # assignments in any order
            for node in _own_nodes(function.node):
                if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) and node.value is not None:
                    targets: list[ast.expr] = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target, value in _pairs(targets, node.value):
                        if self._carries(value, names, module, function):
                            self._bind(target, names, module, function)
        for node in _own_nodes(function.node):
            if isinstance(node, ast.Call):
                self._call(node, names, module, function)

    def _closure(self, module: Module, function: Function) -> set[str]:
        """Names an enclosing function's value reaches (a nested `def` reads them)."""
        outer, _, _ = function.qualname.rpartition(".")
        if not outer or outer not in module.functions:
            return set()
        enclosing = module.functions[outer]
        found = {p.arg for p in enclosing.params if (module.name, enclosing.qualname, p.arg) in self.tainted}
        for node in _own_nodes(enclosing.node):
            if isinstance(node, ast.Assign) and self._carries(node.value, found, module, enclosing):
                found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        own = {p.arg for p in function.params}
        return found - own

    def _reads_attribute(self, module: Module, function: Function) -> bool:
        return function.cls is not None and any(m == module.name and c == function.cls for m, c, _ in self.attributes)

    def _bind(self, target: ast.expr, names: set[str], module: Module, function: Function) -> None:
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif _is_self_attribute(target) and function.cls is not None:
            assert isinstance(target, ast.Attribute)
            self.attributes.add((module.name, function.cls, target.attr))

    def _carries(self, value: ast.expr, names: set[str], module: Module, function: Function) -> bool:
        if isinstance(value, ast.Name):
            return value.id in names
        if isinstance(value, ast.Attribute) and _is_self_attribute(value) and function.cls is not None:
            return (module.name, function.cls, value.attr) in self.attributes
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _COPIES:
            return self._carries(value.func.value, names, module, function)
        if isinstance(value, ast.IfExp):
            return any(self._carries(v, names, module, function) for v in (value.body, value.orelse))
        if isinstance(value, ast.BoolOp):
            return any(self._carries(v, names, module, function) for v in value.values)
        return False

    def _call(self, call: ast.Call, names: set[str], module: Module, function: Function) -> None:
        passed: list[tuple[int | None, str | None, ast.expr]]
        passed = [(i, None, a) for i, a in enumerate(call.args) if not isinstance(a, ast.Starred)]
        passed += [(None, k.arg, k.value) for k in call.keywords if k.arg is not None]
        carrying = [(i, k) for i, k, a in passed if self._carries(a, names, module, function)]
        if not carrying:
            return
        where = (module.name, call.lineno, call.col_offset)
        self.hand_ons.add(where)
        for callee in self._callees(call.func, module):
            if (bridge := _BRIDGES.get(callee.key)) is not None:
                self.tainted.add(bridge)
                self.into.setdefault(where, bridge[0])
            for index, keyword in carrying:
                param = _parameter(callee, index, keyword)
                if param is not None and (param.annotation is None or _names_config(param.annotation)):
                    self.tainted.add((callee.module, callee.qualname, param.arg))
                    self.into.setdefault(where, callee.module)

    def _callees(self, func: ast.expr, module: Module) -> list[Function]:
        if isinstance(func, ast.Name):
            return self._named(func.id, module)
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id in module.imports:
                target, name = module.imports[func.value.id]
                imported = f"{target}.{name}" if name else target
                if imported in self.modules and (found := self._named(func.attr, self.modules[imported])):
                    return found
            return [f for f in self.methods.get(func.attr, []) if not f.node.name.startswith("__")] or []
        return []

    def _named(self, name: str, module: Module) -> list[Function]:
        if name in module.functions:
            return [module.functions[name]]
        if name in module.classes:
            init = module.functions.get(f"{name}.__init__")
            return [init] if init else []
        if name in module.imports:
            target, original = module.imports[name]
            if target in self.modules and original is not None:
                return self._named(original, self.modules[target])
        return []


def _own_nodes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """The nodes of `function`'s body, not those of functions nested in it (lambdas are part of it)."""
    found: list[ast.AST] = []
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        )
    return found


def _pairs(targets: list[ast.expr], value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """Each target with the value it gets: `a, b = x, y` element by element."""
    found = []
    for target in targets:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            found += list(zip(target.elts, value.elts, strict=True))
        else:
            found.append((target, value))
    return found


def _is_self_attribute(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _parameter(callee: Function, index: int | None, keyword: str | None) -> ast.arg | None:
    if keyword is not None:
        return next((p for p in callee.params if p.arg == keyword), None)
    positional = [*callee.node.args.posonlyargs, *callee.node.args.args]
    if callee.cls is not None and positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    assert index is not None
    return positional[index] if index < len(positional) else None


def typed_parameters(modules: dict[str, Module]) -> Counter[str]:
    """Per module, the function parameters annotated with `Config`."""
    found: Counter[str] = Counter()
    for module in modules.values():
        for function in module.functions.values():
            found[module.name] += sum(1 for p in function.params if _names_config(p.annotation))
    return +found


def main() -> None:
    """Print the measurement of the checkout given (default: this one)."""
    args = [a for a in sys.argv[1:] if a != "-v"]
    root = Path(args[0]).resolve() if args else Path(__file__).resolve().parent.parent
    modules = _load(root)
    typed = typed_parameters(modules)
    importing = sorted(
        m.name for m in modules.values() if any(v == ("fedload.config", "Config") for v in m.imports.values())
    )
    reach = Reach(modules)
    reach.run()
    reached = sorted({m for m, _, _ in reach.tainted} | {m for m, _, _ in reach.hand_ons})
    print(f"checkout: {root}")
    print(f"parameters typed Config: {sum(typed.values())} in {len(typed)} modules")
    superhub = sum(n for name, n in typed.items() if name.startswith("fedload.superhub."))
    print(f"  of them in fedload/superhub/: {superhub}")
    print(f"modules importing Config: {len(importing)}")
    print(
        f"run_sync's config: handed on {len(reach.hand_ons)} times, reaches {len(reached)} modules, "
        f"{len({(m, q) for m, q, _ in reach.tainted})} functions"
    )
    into = Counter(reach.into.values())
    for name in ("fedload.superhub.session", "fedload.superhub.pipeline", "fedload.service.worker"):
        print(f"  hand-ons into {name}: {into[name]}")
    if "-v" in sys.argv:
        print("parameters typed Config, per module:")
        for name, count in sorted(typed.items()):
            print(f"  {count:3d} {name}")
        print("modules importing Config:", ", ".join(importing))
        print("modules run_sync's config reaches:", ", ".join(reached))
        print("hand-ons (module:line -> callee's module):")
        for where in sorted(reach.hand_ons):
            print(f"  {where[0]}:{where[1]} -> {reach.into.get(where, '?')}")


if __name__ == "__main__":
    main()
