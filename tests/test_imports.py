"""The import drawing of the project's packages: no cycle (counting imports inside
functions too), no private name imported from another module, and ``strategies`` importing
neither method package except in its dispatching app (docs/architecture.md)."""

from __future__ import annotations

import ast
import os

from conftest import ROOT

PACKAGES = ("strategies", "grauc_flower", "rowfed_flower")


def _modules() -> dict[str, str]:
    out = {}
    for pkg in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, pkg)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    mod = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    out[mod.removesuffix(".__init__")] = path
    return out


def _package(mod: str, path: str) -> str:
    """The package a module's relative imports start from."""
    return mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` statement in ``package`` reads from."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(mod: str, path: str, known) -> list[tuple[str, list[str]]]:
    """``(module, names)`` for every import of a project module in ``path``."""
    package = _package(mod, path)
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            names = [a.name for a in node.names]
            for name in names:  # `from pkg import module`
                if f"{target}.{name}" in known:
                    found.append((f"{target}.{name}", []))
            # the package itself only for what is not a module of it (its attributes)
            attributes = [n for n in names if f"{target}.{n}" not in known]
            if target in known and attributes:
                found.append((target, attributes))
    return found


def _graph():
    mods = _modules()
    return mods, {m: {t for t, _ in _imports(m, p, mods) if t != m} for m, p in mods.items()}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    _, edges = _graph()
    assert len(edges) > 80  # every module was read
    assert _cycles(edges) == []


def test_no_private_name_imported_across_modules():
    mods = _modules()
    private = [
        f"{m} imports {t}.{n}"
        for m, p in mods.items()
        for t, names in _imports(m, p, mods)
        for n in names
        if n.startswith("_") and not n.startswith("__")
    ]
    assert private == []


def _module_aliases(mod: str, path: str, known) -> dict[str, str]:
    """The local names that ``path`` binds to project modules (``from . import tuning``,
    ``import strategies.x as y``), anywhere in the file."""
    package = _package(mod, path)
    out = {}
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            for a in node.names:
                if f"{target}.{a.name}" in known:
                    out[a.asname or a.name] = f"{target}.{a.name}"
    return out


def test_no_private_name_read_from_another_module():
    """No ``module._name`` across modules either (a private helper that moves leaves such a
    reader broken where no import shows it)."""
    mods = _modules()
    found = []
    for m, path in mods.items():
        aliases = _module_aliases(m, path, mods)
        for node in ast.walk(ast.parse(open(path).read())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{m}:{node.lineno} reads {aliases[node.value.id]}.{node.attr}")
    assert found == []


def test_strategies_imports_no_method_package_but_in_its_app():
    _, edges = _graph()
    upward = [
        f"{m} -> {t}"
        for m, targets in edges.items()
        if m.startswith("strategies") and m != "strategies.app"
        for t in targets
        if t.startswith(("grauc_flower", "rowfed_flower"))
    ]
    assert upward == []


#: ``strategies/``'s rooms: each role is a folder; only these modules stay at its top.
ROOMS = {"client", "config", "datasets", "experiments", "runtime", "server", "solvers", "stats"}
TOP_MODULES = {"__init__", "api", "app", "errors", "report"}


def _imports_flower(path: str) -> bool:
    """Whether the module at ``path`` imports ``flwr`` anywhere (inside functions too)."""
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "flwr" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] == "flwr":
                return True
    return False


def _reach(edges: dict[str, set[str]], start: str) -> set[str]:
    """Every project module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for t in edges[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_the_import_rule_checks_find_what_they_look_for():
    assert _reach({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}, "a") == {"b", "c"}
    mods = _modules()
    assert _imports_flower(mods["strategies.server.base"])
    assert not _imports_flower(mods["strategies.solvers.pqn"])


def test_each_role_is_a_folder_of_strategies():
    """docs/architecture.md: a module of ``strategies/`` lives in the folder of its role."""
    top = os.path.join(ROOT, "strategies")
    folders = {f for f in os.listdir(top) if os.path.isfile(os.path.join(top, f, "__init__.py"))}
    modules = {f[:-3] for f in os.listdir(top) if f.endswith(".py")}
    assert folders == ROOMS | {"wire"}
    assert modules == TOP_MODULES


def test_solvers_import_no_flower():
    """The mathematics runs without Flower: no module of ``strategies/solvers/`` imports
    ``flwr``, nor any project module it reaches."""
    mods, edges = _graph()
    solvers = [m for m in mods if m.startswith("strategies.solvers")]
    assert len(solvers) > 10
    flower = {m for m, p in mods.items() if _imports_flower(p)}
    found = {m: sorted(({m} | _reach(edges, m)) & flower) for m in solvers}
    assert {m: f for m, f in found.items() if f} == {}


def test_the_sites_side_imports_nothing_of_the_server():
    """A site runs ``strategies/client/`` without the server's code: no module there reaches
    ``strategies/server/`` (the two halves meet in ``strategies/wire/``)."""
    mods, edges = _graph()
    clients = [m for m in mods if m.startswith("strategies.client")]
    assert len(clients) >= 4
    found = {
        m: sorted(t for t in _reach(edges, m) if t.startswith("strategies.server")) for m in clients
    }
    assert {m: f for m, f in found.items() if f} == {}


def test_both_method_packages_list_the_same_modules():
    """docs/architecture.md: the same roles under the same module names in both packages."""
    names = {
        pkg: sorted(f for f in os.listdir(os.path.join(ROOT, pkg)) if f.endswith(".py"))
        for pkg in ("grauc_flower", "rowfed_flower")
    }
    assert names["grauc_flower"] == names["rowfed_flower"]


#: One name per concept in both method packages: module -> the public names both define.
MIRRORED = {
    "api": ("fit_to_dir", "example_data", "DATA_OPTIONS"),
    "cli": ("build_parser", "main", "dispatch", "cmd_fit"),
    "sources": ("DataSpec",),
    "graph": ("build_graph",),
    "datafit": ("start_fit",),
    "tuning": ("tune", "cross_validate", "used_levels"),
    "federated_tuning": (
        "federated_plan",
        "federated_options",
        "federated_strategy",
        "federated_outputs",
        "tuned_strategy",
        "run_tuned_inprocess",
        "tuning_waves",
    ),  # fmt: skip
    "inference": ("oracle_fit", "inference_table"),
    "realdata": ("load_crime",),
    "federation": ("run_methods_inprocess", "write_result", "write_test_table"),
    "app": ("make_client", "run"),
    "fitreport": ("fit_report",),
}


def test_both_method_packages_use_the_same_public_names():
    """The same concept has the same name in both packages (module by module), and each
    package exports its estimator (docs/api.md)."""
    import importlib

    for module, names in MIRRORED.items():
        for pkg in ("grauc_flower", "rowfed_flower"):
            mod = importlib.import_module(f"{pkg}.{module}")
            missing = [n for n in names if not hasattr(mod, n)]
            assert missing == [], f"{pkg}.{module} lacks {missing}"
    import grauc_flower
    import rowfed_flower

    assert grauc_flower.GrAUCPFL.__name__ == "GrAUCPFL" and rowfed_flower.RowFed.fit


def test_both_methods_results_name_their_common_fields_alike():
    """A fit's in-process result (``federation.MethodResult``) calls the same things by the
    same names in both packages: the fitted coefficients are ``coefficients`` in both."""
    import dataclasses

    from grauc_flower.federation import MethodResult as GrAUCResult
    from rowfed_flower.federation import MethodResult as RowFedResult

    common = {"method", "sites", "coefficients", "history", "evaluation", "converged", "rounds",
              "extra"}  # fmt: skip
    for cls in (GrAUCResult, RowFedResult):
        assert common <= {f.name for f in dataclasses.fields(cls)}, cls.__module__


def test_comparators_are_declared_classes():
    """Each FedAvg-family comparator of both methods is a class written out in its module
    (go to definition finds it): Flower's own strategy behind the method's FedAvg for the
    global-model methods, the personal stages before it for the personalized ones."""
    import inspect

    from strategies.config import FEDAVG_FAMILY, PERSONAL_METHODS
    from strategies.server import grauc, rowfed
    from strategies.server.fedavg import FLOWER_CLASSES, ClusterStage, PersonalStage

    for module, base in ((grauc, grauc.GrAUCFedAvg), (rowfed, rowfed.RowFedAvg)):
        assert set(module.COMPARATORS) == set(FEDAVG_FAMILY)
        for name, cls in module.COMPARATORS.items():
            assert f"class {cls.__name__}(" in inspect.getsource(module)
            assert issubclass(cls, base) and cls.__module__ == module.__name__
            if name in PERSONAL_METHODS:
                stages = (ClusterStage, PersonalStage) if name == "ifca" else (PersonalStage,)
                assert cls.__bases__ == (*stages, base)
                assert cls.personal == {"ditto": "ditto", "fedavg-ft": "finetune"}.get(
                    name, "choose"
                )
            elif name != "fedavg":
                assert cls.__bases__ == (base, FLOWER_CLASSES[name])
                assert cls.flower_name == name
