"""Dependency rules that import-linter cannot express: spec is stdlib-only, the core sans-I/O."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    """The absolute module names ``path`` imports (relative imports left out)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _imported_top_levels(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _imported_modules(path)}


def test_spec_imports_only_the_standard_library_and_itself() -> None:
    def allowed(module: str) -> bool:
        own = module == "bkref.spec" or module.startswith("bkref.spec.")
        return own or module.split(".", 1)[0] in sys.stdlib_module_names

    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imported_modules(path) if not allowed(m))
        for path in sorted((ROOT / "bkref" / "spec").rglob("*.py"))
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}, f"spec must stay pure and stdlib-only: {offenders}"


def test_the_scan_sees_third_party_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json\nfrom kazoo.client import KazooClient\nfrom . import x\n"
        "from bkref.impl.core import quorum\n"
    )
    assert _imported_top_levels(probe) == {"json", "kazoo", "bkref"}
    assert _imported_modules(probe) == {"json", "kazoo.client", "bkref.impl.core"}


def test_the_core_does_no_io_and_reads_no_clock() -> None:
    """bkref/impl/core is sans-I/O: no event loop, no ZooKeeper, no sockets or threads, and no
    clock (time comes in with the events; the shells read an injected Clock)."""
    forbidden = {"asyncio", "kazoo", "socket", "threading", "time", "selectors"}
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_top_levels(path) & forbidden)
        for path in sorted((ROOT / "bkref" / "impl" / "core").rglob("*.py"))
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}, f"bkref/impl/core must stay sans-I/O: {offenders}"
