"""bkref as an installed package: one namespace, its data files, and every third-party
module it imports declared in pyproject.toml.

The wheel is built from this checkout without network (no build isolation: the dev
environment has setuptools) and installed into a directory of its own; the commands run
from a directory outside the checkout with only that directory and the environment's
third-party packages on the path.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / "tests" / "data" / "peer-histories"

pytestmark = pytest.mark.slow
PIP = [sys.executable, "-m", "pip", "-q"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("build-src") / "bkref-src"
    # Build from a copy, so that the build's own build/ and egg-info stay out of the checkout.
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "out", "__pycache__", "*.egg-info", "build", ".*_cache", "tests"
        ),
    )
    subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("bkref-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [*PIP, "install", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    return target


def _outside(installed: Path, cwd: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``cwd`` with the installed copy first on the path."""
    env = {**os.environ, "PYTHONPATH": str(installed)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def test_the_wheel_holds_only_the_bkref_namespace_and_its_data_files(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    name, version = wheel.name.split("-")[:2]
    assert {n.split("/")[0] for n in names} == {"bkref", f"{name}-{version}.dist-info"}
    for data in (
        "bkref/py.typed",
        "bkref/docker/Dockerfile",
        "bkref/docker/bkref-node",
        "bkref/docker/build-base.sh",
        "bkref/docker/compose.yaml",
        "bkref/docker/compose/zoo1.cfg",
        "bkref/spec/examples/ack-before-fsync.txt",
    ):
        assert data in names, f"{data} is not in the wheel"
    examples = {n for n in names if n.startswith("bkref/spec/examples/")}
    assert len(examples) == len(list((ROOT / "bkref" / "spec" / "examples").glob("*.txt")))


def test_installed_bkref_imports_as_one_namespace_outside_the_checkout(
    installed: Path, tmp_path: Path
) -> None:
    probe = (
        "import bkref, bkref.spec, bkref.linearizability, bkref.impl, bkref.nemesis, "
        "bkref.spark_checks, bkref.refine\n"
        "print(bkref.__file__)\n"
        "import importlib.util\n"
        "print([m for m in ('spec', 'impl', 'linearizability', 'nemesis', 'spark_checks', "
        "'refine') if importlib.util.find_spec(m) is not None])\n"
    )
    done = _outside(installed, tmp_path, [sys.executable, "-c", probe])
    assert done.returncode == 0, done.stderr
    where, top_levels = done.stdout.splitlines()
    assert Path(where).is_relative_to(installed)
    assert top_levels == "[]"  # `import spec` fails: nothing generic was installed


def test_the_installed_command_checks_a_history_and_the_spec_outside_the_checkout(
    installed: Path, tmp_path: Path
) -> None:
    bkref = [str(installed / "bin" / "bkref")]
    good = shutil.copy(PEER / "jepsen" / "etcd_002.log", tmp_path / "h.log")
    done = _outside(installed, tmp_path, [*bkref, "check", str(good)])
    assert done.returncode == 0, done.stdout + done.stderr
    done = _outside(installed, tmp_path, [*bkref, "spec", "check", "--config", "a-short"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no invariant violated" in done.stdout
    # The spec's examples are package data, read by the installed command.
    done = _outside(installed, tmp_path, [*bkref, "spec", "example", "ack-before-fsync"])
    assert done.returncode == 0, done.stderr
    stored = (ROOT / "bkref" / "spec" / "examples" / "ack-before-fsync.txt").read_text()
    assert done.stdout == stored


# ------------------------------------------------------------- declared dependencies


def _third_party_imports(package: Path) -> dict[str, set[str]]:
    """Top-level third-party module -> the files of ``package`` that import it (lazy
    imports inside functions included)."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".", 1)[0]
                if top != "bkref" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(package.parent)))
    return found


def _name(requirement: str) -> str:
    """The normalized distribution name of a requirement string (PEP 503)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _distributions(modules: Iterator[str] | set[str]) -> dict[str, str]:
    by_module = importlib.metadata.packages_distributions()
    out = {}
    for m in modules:
        assert m in by_module, f"{m} is imported by bkref but installed by no distribution"
        out[m] = _name(by_module[m][0])
    return out


def test_every_module_bkref_imports_is_a_declared_dependency_and_every_one_is_used() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    testing = {_name(r) for r in project["optional-dependencies"]["testing"]}
    imports = _third_party_imports(ROOT / "bkref")
    dists = _distributions(set(imports))
    undeclared = {m: sorted(imports[m]) for m, d in dists.items() if d not in runtime | testing}
    assert undeclared == {}, f"imported but not declared in pyproject.toml: {undeclared}"
    # The `testing` extra is for the pytest plugin only: nothing else may need it.
    for m, d in dists.items():
        if d in testing and d not in runtime:
            assert imports[m] <= {"bkref/impl/cluster/pytest_plugin.py"}, (
                f"{m} (the testing extra) imported by {sorted(imports[m])}"
            )
    unused = runtime - set(dists.values())
    assert unused == set(), f"declared but imported nowhere in bkref/: {sorted(unused)}"


def test_the_import_scan_sees_lazy_and_from_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "import json\nfrom . import x\nfrom bkref.spec import protocol\n"
        "def f() -> None:\n    import numpy.random\n    from kazoo.client import KazooClient\n"
    )
    assert _third_party_imports(package) == {"numpy": {"pkg/m.py"}, "kazoo": {"pkg/m.py"}}
