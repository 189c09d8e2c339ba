"""The compiled build of the spec (bkref.spec.build): chosen only when current, and equal to
the source on what the checker finds.

The comparison runs `bkref spec check --json` twice per config, once on the source
(``BKREF_SPEC=pure``) and once on the build (``BKREF_SPEC=compiled``), and wants the
same distinct states, transitions, depth and verdict, and for a mutant the same
shortest trace, step by step. `make verify` compares a few configs and mutants chosen
for speed and spread (AutoRecovery, recovery, readers, liveness); `make spec-build-equal`
sets ``BKREF_SPEC_EQUAL=all`` and compares every config `make spec-check` checks and
every mutant's config. Both replay every stored trace of a real run (tests/data).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bkref.spec import build
from bkref.spec.config import MUTANTS
from bkref.spec.configs import MUTANT_CONFIGS, NAMED

# verify's share: small configs of different actors, and mutants with short traces (c, not
# c-race: the same actors at a third of the CPU; `make spec-build-equal` compares c-race).
SHORT_CONFIGS = ("c", "c-check-crash", "live-check", "a-give-up")
SHORT_MUTANTS = ("recovery-reads-without-fence", "worker-skips-ledger-lock", "ack-before-fsync")
ALL = os.environ.get("BKREF_SPEC_EQUAL") == "all"
CONFIGS = tuple(NAMED) if ALL else SHORT_CONFIGS
CHECKED_MUTANTS = tuple(MUTANTS) if ALL else SHORT_MUTANTS


# ------------------------------------------------------------------ which build runs


def _fake_build(root: Path) -> Path:
    d = root / build.source_hash()
    (d / "bkref" / "spec").mkdir(parents=True)
    (d / build.READY).write_text("test\n")
    return d


def test_the_source_runs_when_no_build_of_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BKREF_SPEC_BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("BKREF_SPEC", "auto")
    assert build.activate(["src"]) == ["src"]
    # An incomplete build (no READY: its compile died) is not used either.
    (tmp_path / build.source_hash() / "bkref" / "spec").mkdir(parents=True)
    assert build.activate(["src"]) == ["src"]


def test_a_complete_build_of_this_source_goes_first_unless_pure_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BKREF_SPEC_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))
    d = _fake_build(tmp_path)
    for mode in ("auto", "compiled"):
        monkeypatch.setenv("BKREF_SPEC", mode)
        assert build.activate(["src"]) == [str(d / "bkref" / "spec"), "src"]
        assert str(d) in sys.path  # where the group's shared library is found
    monkeypatch.setenv("BKREF_SPEC", "pure")
    assert build.activate(["src"]) == ["src"]


def test_compiled_without_a_build_is_an_error_that_says_how_to_make_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BKREF_SPEC_BUILD_DIR", str(tmp_path))
    monkeypatch.setenv("BKREF_SPEC", "compiled")
    with pytest.raises(ImportError, match="run `bkref spec build`"):
        build.activate(["src"])
    monkeypatch.setenv("BKREF_SPEC", "fast")
    with pytest.raises(ImportError, match="'fast' is not one of auto, pure, compiled"):
        build.activate(["src"])


def test_a_build_is_named_by_its_source_so_an_edited_module_never_runs_a_stale_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (*build.MODULES, *build.TYPES_ONLY):
        shutil.copyfile(build.PACKAGE_DIR / f"{name}.py", tmp_path / f"{name}.py")
    monkeypatch.setattr(build, "PACKAGE_DIR", tmp_path)
    before = build.source_hash()
    assert before == build.source_hash()
    protocol = tmp_path / "protocol.py"
    protocol.write_text(protocol.read_text().replace("<= cfg.pipeline", "< cfg.pipeline", 1))
    assert build.source_hash() != before


# ------------------------------------------------------------------ the build equals the source


# The first test to ask for the build waits for its compile: about 80 CPU seconds, several
# minutes beside a loaded `make verify`.
BUILD_TIMEOUT = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def compiled() -> Path:
    why = build.compiler_missing()
    if why is not None:
        pytest.skip(f"no compiled build on this machine: {why}")
    return build.build(progress=None)


def _check(mode: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "BKREF_SPEC": mode}
    done = subprocess.run(
        [sys.executable, "-m", "bkref.impl.cli.main", "spec", "check", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert done.returncode in (0, 1), f"bkref spec check {' '.join(args)}: {done.stderr[-2000:]}"
    out: dict[str, Any] = json.loads(done.stdout)
    return out


# What the build must report as the source does (bkref spec check --json).
SAME = ("distinct", "explored", "depth", "levels", "complete", "violation", "trace", "liveness")


def _same(pure: dict[str, Any], comp: dict[str, Any]) -> None:
    assert pure["spec"].startswith("pure Python")
    assert comp["spec"].startswith("compiled (mypyc")
    for key in SAME:
        assert comp.get(key) == pure.get(key), key


@pytest.mark.slow
@BUILD_TIMEOUT
@pytest.mark.parametrize("config", CONFIGS)
def test_the_build_explores_what_the_source_explores(compiled: Path, config: str) -> None:
    _same(_check("pure", "--config", config), _check("compiled", "--config", config))


@pytest.mark.slow
@BUILD_TIMEOUT
@pytest.mark.parametrize("mutant", CHECKED_MUTANTS)
def test_the_build_finds_a_mutant_by_the_same_shortest_trace(compiled: Path, mutant: str) -> None:
    args = ("--mutant", mutant, "--config", MUTANT_CONFIGS[mutant].name)
    pure = _check("pure", *args)
    assert pure["violation"] is not None
    _same(pure, _check("compiled", *args))


@pytest.mark.slow
@BUILD_TIMEOUT
def test_the_build_keeps_a_layer_on_disk_with_fingerprints(compiled: Path) -> None:
    # mypyc evaluates a generator expression eagerly: the checker once walked the layer it
    # expands with one, and the compiled build held the whole layer in memory (a-crash at
    # 60,000 states: 242 MiB compiled against 33 MiB pure).
    args = ("--config", "a-crash", "--fingerprints", "--max-states", "60000", "--quiet")
    pure, comp = _check("pure", *args), _check("compiled", *args)
    assert comp["distinct"] == pure["distinct"]
    assert comp["levels"] == pure["levels"]
    assert comp["rss_bytes"] < 2 * pure["rss_bytes"], (comp["rss_bytes"], pure["rss_bytes"])


# Every stored trace, in verify too: a replay takes paths no config's BFS does (a soak
# ledger found a compiled generator that ``in`` could not search).
TRACES = Path(__file__).resolve().parents[1] / "data"
TRACE_DIRS = sorted(
    p
    for kind in ("tracecheck-soak", "tracecheck-findings")
    for p in (TRACES / kind).iterdir()
    if p.is_dir()
)


def _trace_check(mode: str, trace: Path, out: Path) -> list[dict[str, Any]]:
    ledger = trace.name.rsplit("-", 1)[1]
    # The budget of test_soak_ledgers.py. The configurations a search visits are not
    # compared: how far it widens before it finds the explanation depends on its clock.
    argv = ["trace", "check", str(trace), "--ledger", ledger, "--json", str(out), "--budget", "20"]
    subprocess.run(
        [sys.executable, "-m", "bkref.impl.cli.main", *argv],
        env={**os.environ, "BKREF_SPEC": mode},
        capture_output=True,
        check=False,
        timeout=600,
    )
    keys = ("ledger", "verdict", "steps", "replayed", "reason", "event")
    return [{k: v.get(k) for k in keys} for v in json.loads(out.read_text())]


@pytest.mark.slow
@BUILD_TIMEOUT
@pytest.mark.parametrize("trace", TRACE_DIRS, ids=lambda p: p.name)
def test_the_build_replays_a_run_s_trace_as_the_source_does(
    compiled: Path, trace: Path, tmp_path: Path
) -> None:
    pure = _trace_check("pure", trace, tmp_path / "pure.json")
    assert pure, trace
    assert all(v["verdict"] in ("explained", "violation") for v in pure), pure
    assert _trace_check("compiled", trace, tmp_path / "compiled.json") == pure
