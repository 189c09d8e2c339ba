"""Checkpoints: a search stopped and run again from its checkpoint finds what one run finds.

Each run is its own process, as a user's runs are: fingerprints are Python's hash, so a
run goes on from another's only under the same PYTHONHASHSEED (bkref.spec.checkpoint).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BKREF = (sys.executable, "-m", "bkref.impl.cli.main")
# What a search found; seconds, rate and memory differ between runs.
SAME = ("distinct", "explored", "depth", "complete", "levels", "violation", "trace")


def _spec(*args: str, seed: str | None = "7") -> subprocess.CompletedProcess[str]:
    """``bkref spec check --fingerprints --no-liveness ARGS``; see :func:`_run`."""
    return _run("--fingerprints", "--no-liveness", *args, seed=seed)


def _run(*args: str, seed: str | None = "7") -> subprocess.CompletedProcess[str]:
    """``bkref spec check ARGS`` in a process of its own, under PYTHONHASHSEED ``seed``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    return subprocess.run(
        [*BKREF, "spec", "check", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def _found(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(run.stdout)
    return {k: out.get(k) for k in SAME}


def test_a_search_stopped_and_run_again_goes_on_to_what_one_run_finds(tmp_path: Path) -> None:
    whole = _spec("--config", "c", "--json")
    assert whole.returncode == 0, whole.stderr
    stopped = _spec("--config", "c", "--checkpoint", str(tmp_path), "--max-states", "8000")
    assert stopped.returncode == 0, stopped.stderr
    assert "incomplete: state limit" in stopped.stdout
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert 0 < meta["distinct"] <= 8000
    assert not meta["complete"]
    again = _spec("--config", "c", "--checkpoint", str(tmp_path))
    assert again.returncode == 0, again.stderr
    went_on = f"going on from the checkpoint in {tmp_path}: level {meta['depth']} done"
    assert went_on in again.stderr
    assert f"{_found(whole)['distinct']:,} distinct states" in again.stdout
    # The finished search is saved too: run again, it answers with the whole result.
    done = _spec("--config", "c", "--checkpoint", str(tmp_path), "--json")
    assert json.loads((tmp_path / "meta.json").read_text())["complete"]
    assert _found(done) == _found(whole)


def test_a_violation_found_after_going_on_has_the_one_runs_shortest_trace(tmp_path: Path) -> None:
    mutant = ("--mutant", "recovery-reads-without-fence")
    whole = _spec(*mutant, "--json")
    assert whole.returncode == 1, whole.stderr
    stopped = _spec(*mutant, "--checkpoint", str(tmp_path), "--max-states", "1500")
    assert stopped.returncode == 0, stopped.stderr
    again = _spec(*mutant, "--checkpoint", str(tmp_path))
    assert again.returncode == 1, again.stderr
    assert "going on from the checkpoint" in again.stderr
    # A violation saves nothing: the checkpoint still ends where the first run left it.
    again_json = _spec(*mutant, "--checkpoint", str(tmp_path), "--json")
    assert _found(again_json) == _found(whole)
    assert _found(whole)["violation"] == "NoDivergenceBetweenClientAndMetaData"


def test_what_a_killed_run_wrote_past_its_last_level_is_cut_off(tmp_path: Path) -> None:
    """A run killed while it appended a level's fingerprints and parents leaves them past
    what meta.json counts: the next run reads only what the checkpoint counts."""
    whole = _spec("--config", "a-short", "--json")
    _spec("--config", "a-short", "--checkpoint", str(tmp_path), "--max-states", "1200")
    for name in ("fps.bin", "parent.bin"):
        with (tmp_path / name).open("ab") as f:
            f.write(os.urandom(8 * 500))
    again = _spec("--config", "a-short", "--checkpoint", str(tmp_path), "--json")
    assert again.returncode == 0, again.stderr
    assert _found(again) == _found(whole)
    count = json.loads((tmp_path / "meta.json").read_text())["distinct"]
    assert (tmp_path / "fps.bin").stat().st_size == 8 * count


@pytest.mark.parametrize(
    ("args", "seed", "says"),
    [
        (("--config", "c"), "7", "another config"),
        (("--config", "a-short"), "8", "another hash_seed"),
        (("--config", "a-short", "--no-symmetry"), "7", "another symmetry"),
    ],
)
def test_a_checkpoint_of_another_search_is_refused_by_what_differs(
    tmp_path: Path, args: tuple[str, ...], seed: str, says: str
) -> None:
    first = _spec("--config", "a-short", "--checkpoint", str(tmp_path), "--max-states", "500")
    assert first.returncode == 0, first.stderr
    other = _spec(*args, "--checkpoint", str(tmp_path), seed=seed)
    assert other.returncode == 2
    assert says in other.stderr, other.stderr
    assert "use a new directory" in other.stderr


def test_without_a_fixed_hash_seed_there_is_no_checkpoint(tmp_path: Path) -> None:
    run = _spec("--config", "a-short", "--checkpoint", str(tmp_path), seed=None)
    assert run.returncode == 2
    assert "needs a fixed PYTHONHASHSEED" in run.stderr
    assert not (tmp_path / "meta.json").exists()


def test_a_checkpoint_needs_fingerprints() -> None:
    run = _run("--config", "a-short", "--checkpoint", "x")
    assert run.returncode == 2
    assert "--checkpoint goes with --fingerprints" in run.stderr
