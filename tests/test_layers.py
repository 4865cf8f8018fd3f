"""Layers import downward only: base < db, planner < fitting < runner (rl < builtin < sweep) < views < api < dashboard <
cli.

A lower layer that imports the CLI (or fitting that imports the runner, ...) fails this test, so the layout
the README describes stays the layout the code has."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder in the repo -> the package it installs as (pyproject.toml's package-dir)
PACKAGE_DIRS = {
    "rlscale": "rlscale",
    "db": "rlscale.db",
    "planner": "rlscale.planner",
    "fitting": "rlscale.fitting",
    "runner": "rlscale.runner",
}
# (prefix, rank): a module may import modules of a strictly lower rank, or of its own layer
LAYERS = [
    ("rlscale.base", 0),
    ("rlscale.db", 1),
    ("rlscale.planner", 1),
    ("rlscale.fitting", 2),
    # runner/: the algorithm, then what engines share (runner/*.py), then the engines (builtin, verl, trl), then the
    # sweep
    ("rlscale.runner.rl", 3),
    ("rlscale.runner", 3.5),
    ("rlscale.runner.builtin", 4),
    ("rlscale.runner.verl", 4),
    ("rlscale.runner.trl", 4),
    ("rlscale.runner.sweep", 5),
    ("rlscale.views", 5.2),  # presentation: words, the report, the page and its charts, plots (never the runner's)
    ("rlscale.api", 5.3),  # the notebook API: fitting's fits and decision, views' words and plots, as the CLI's
    ("rlscale.dashboard", 5.5),  # the web app: reads the store, fits (fitting) and run states (runner.sweep.state)
    ("rlscale.cli", 6),
    ("rlscale.__main__", 7),
    ("rlscale", 0),  # rlscale/__init__.py (the version) is part of the base
]


def layer_of(module: str) -> tuple[str, int] | None:
    """The most specific layer a module belongs to, or None for modules outside rlscale."""
    for prefix, rank in sorted(LAYERS, key=lambda item: -len(item[0])):
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    return None


def imported_modules(source: str, module: str) -> list[str]:
    """Every module `source` imports, anywhere in the file (lazy imports inside functions included)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                base = module.split(".")[: -node.level]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.append(target)
            names += [f"{target}.{alias.name}" for alias in node.names]
    return names


# rlscale/__init__.py names the notebook API's functions and imports rlscale.api on first use (PEP 562 __getattr__),
# so `import rlscale` itself loads nothing above the base
LAZY = {("rlscale", "rlscale.api")}


def layer_violations(modules: dict[str, str]) -> list[str]:
    """'importer -> imported' for every import that goes up the layers or sideways (db <-> planner)."""
    found = []
    for module, source in modules.items():
        mine = layer_of(module)
        for target in imported_modules(source, module):
            theirs = layer_of(target)
            if mine is None or theirs is None or theirs[0] == mine[0] or theirs[1] < mine[1]:
                continue
            if (module, theirs[0]) in LAZY:
                continue
            found.append(f"{module} -> {target}")
    return sorted(set(found))


def repo_modules() -> dict[str, str]:
    modules = {}
    for folder, package in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path.read_text()
    return modules


def test_the_repo_imports_downward_only():
    assert layer_violations(repo_modules()) == []


def test_a_lower_layer_importing_the_cli_is_caught():
    modules = repo_modules()
    modules["rlscale.db.bad"] = "def f():\n    from rlscale.cli.console import console\n"
    modules["rlscale.fitting.bad"] = "import rlscale.runner.builtin.job\n"
    modules["rlscale.planner.bad"] = "from rlscale.db import store\n"
    modules["rlscale.runner.rl.bad"] = "from rlscale.runner.sweep.driver import SweepDriver\n"
    modules["rlscale.base.bad"] = "from ..db.store import Store\n"
    assert layer_violations(modules) == [
        "rlscale.base.bad -> rlscale.db.store",
        "rlscale.base.bad -> rlscale.db.store.Store",
        "rlscale.db.bad -> rlscale.cli.console",
        "rlscale.db.bad -> rlscale.cli.console.console",
        "rlscale.fitting.bad -> rlscale.runner.builtin.job",
        "rlscale.planner.bad -> rlscale.db",
        "rlscale.planner.bad -> rlscale.db.store",
        "rlscale.runner.rl.bad -> rlscale.runner.sweep.driver",
        "rlscale.runner.rl.bad -> rlscale.runner.sweep.driver.SweepDriver",
    ]


def test_downward_and_same_layer_imports_are_allowed():
    modules = {
        "rlscale.fitting.ok": (
            "from rlscale.planner.recipe import Recipe\nfrom rlscale.fitting.sigmoid import fit_sigmoid\n"
        ),
        "rlscale.runner.sweep.ok": (
            "from rlscale.runner.builtin.job import run_job\nfrom rlscale.runner.rl import losses\n"
        ),
        "rlscale.cli.ok": (
            "from rlscale.runner.sweep.driver import SweepDriver\nfrom rlscale.base.errors import UserError\n"
        ),
    }
    assert layer_violations(modules) == []


def test_every_package_folder_is_installed():
    """A folder of modules missing from pyproject's package list works in an editable install and is absent from
    `pip install .`: each one is listed, under the name its folder maps to."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for folder, package in PACKAGE_DIRS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "migrations" in init.parts:  # package data of rlscale.db, not a package
                continue
            found.add(".".join([package, *init.parent.relative_to(ROOT / folder).parts]))
    assert found - listed == set()


# Private names of other libraries that rlscale uses on purpose: JobSubmissionClient has no public call for the
# dashboard's cluster-status endpoint (runner/cluster.py); os._exit ends an engine's child process at once
THIRD_PARTY_PRIVATE = {"_do_request", "_exit"}


def private_reaches(modules: dict[str, str]) -> list[str]:
    """'module: what' for each private name a module takes from another rlscale module: `from x import _name`, or
    `obj._name` (obj not self or cls) where no module of the same name defines `_name` itself."""
    defined = {module: _private_names(source) for module, source in modules.items()}
    found = []
    for module, source in modules.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("rlscale")):
                found += [
                    f"{module}: from {node.module} import {alias.name}"
                    for alias in node.names
                    if _is_private(alias.name)
                ]
            elif (
                isinstance(node, ast.Attribute)
                and _is_private(node.attr)
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                if node.attr not in defined[module] and node.attr not in THIRD_PARTY_PRIVATE:
                    found.append(f"{module}: {ast.unparse(node)}")
    return sorted(set(found))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names(source: str) -> set[str]:
    """The private names a module defines: functions, classes, attributes it assigns, annotated fields."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if _is_private(name)}


def test_no_module_reaches_into_another_modules_private_names():
    assert private_reaches(repo_modules()) == []


def test_a_private_reach_is_caught():
    modules = {
        "rlscale.runner.sweep.pool": "def start(driver):\n    driver._refit()\n",
        "rlscale.runner.sweep.driver": "class D:\n    def _refit(self):\n        self._fits = 1\n",
        "rlscale.db.logs": "from rlscale.db.importer import _unique_keys\n",
    }
    assert private_reaches(modules) == [
        "rlscale.db.logs: from rlscale.db.importer import _unique_keys",
        "rlscale.runner.sweep.pool: driver._refit",
    ]


def test_no_test_module_imports_another():
    """Shared test helpers live in tests/helpers.py (fixtures in conftest.py): a test module that imports
    another runs that module's tests' set-up twice and ties the two together."""
    found = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [f"{path.name}: {name}" for name in names if name.split(".")[0].startswith("test_")]
    assert found == []
