"""cosmic-ray sessions for `make mutation`: a sample of mutants, run on copies of the tree.

cosmic-ray (https://github.com/sixty-north/cosmic-ray) makes the mutants and runs them:
``cosmic-ray init`` lists every mutant of the target's modules in an SQLite session
(nothing runs), and ``cosmic-ray exec`` applies each pending one to the file in place,
runs the target's test command, and restores the file. This module only chooses what
runs and where:

- **Copies.** cosmic-ray edits the file it mutates, and a killed exec leaves the
  mutant there; so every exec runs in a copy of the tree (its tracked files), never in
  the checkout, and a resumed shard first puts the copy's sources back.
- **A sample.** Operators that only repeat another's kind at the same site (``+``
  swapped for each of ``**``, ``<<``, ``|``, ...) are filtered out by the target's
  ``exclude-operators``; of the rest, ``sample`` mutants are drawn uniformly with the
  seed, from the mutants sorted by (module, operator, occurrence), so a seed names
  the same sample whatever order cosmic-ray listed them in, none in an annotation
  (tests/mutation/sampling.py). The others are marked skipped, as cosmic-ray's own
  filters do.
- **Shards.** One exec per worker, each in its own copy with its own copy of the
  session, every job in exactly one shard (cosmic-ray's local distributor runs one
  job at a time; its HTTP one gives up on a request after aiohttp's 5 minutes, which a
  surviving spec mutant outlasts).

The settings are pyproject.toml's ``[tool.bkref.mutation.<target>]``; what a target
leaves out, ``[tool.bkref.mutation]`` gives for all (the operator filter).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.mutation.sampling import DRAW, draw
from tests.mutation.stopping import stop

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SAMPLED_OUT = "not in the sample"
OTHER_SHARD = "in another shard"
# What ran, kept in the repository: a session on a new machine (same sources, sample and
# seed) takes these results instead of running their mutants again.
STORED = Path(__file__).with_name("results")


@dataclass(frozen=True)
class Target:
    """What a target mutates and how its mutants are tested (pyproject.toml)."""

    name: str
    modules: tuple[str, ...]
    test_command: str  # {python} and {work} are filled in
    timeout: float  # seconds per mutant, after which cosmic-ray counts it killed
    exclude_operators: tuple[str, ...]
    baseline_command: str = ""  # run once on the unmutated copy before the first exec

    @staticmethod
    def load(name: str, pyproject: Path = ROOT / "pyproject.toml") -> Target:
        tool = tomllib.loads(pyproject.read_text())["tool"]["bkref"]["mutation"]
        targets = {k: v for k, v in tool.items() if isinstance(v, dict)}
        if name not in targets:
            raise SystemExit(f"no target {name!r} in pyproject.toml; known: {', '.join(targets)}")
        t = targets[name]
        return Target(
            name=name,
            modules=tuple(t["modules"]),
            test_command=t["test-command"],
            timeout=float(t["timeout"]),
            exclude_operators=tuple(t.get("exclude-operators", tool.get("exclude-operators", ()))),
            baseline_command=t.get("baseline-command", ""),
        )

    def sources(self, root: Path = ROOT) -> list[Path]:
        """The files mutated, relative to the tree."""
        out: list[Path] = []
        for m in self.modules:
            p = root / m
            out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
        return [p.relative_to(root) for p in out]

    def digest(self, root: Path = ROOT) -> str:
        """Names the sources and the test scripts: a session is resumed, and stored
        results reused, only on the same ones."""
        h = hashlib.sha256()
        for p in self.sources(root):
            h.update(str(p).encode() + b"\0" + (root / p).read_bytes())
        for script in self.scripts():
            h.update(script.name.encode() + b"\0" + script.read_bytes())
        return h.hexdigest()[:16]

    def scripts(self) -> list[Path]:
        """The scripts of tests/mutation that the target's commands run (``-m
        tests.mutation.NAME``), with what they import from there: another target's
        test script changing leaves this one's results standing."""
        here = Path(__file__).parent
        commands = f"{self.test_command} {self.baseline_command}"
        todo = re.findall(r"-m tests\.mutation\.(\w+)", commands)
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for node in ast.walk(ast.parse((here / f"{name}.py").read_text())):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                if node.module == "tests.mutation":
                    todo += [a.name for a in node.names]
                elif node.module.startswith("tests.mutation."):
                    todo.append(node.module.rsplit(".", 1)[1])
        return sorted(here / f"{n}.py" for n in seen)


def copy_tree(dest: Path) -> None:
    """The checkout's files (tracked, or new and not ignored; as they are on disk)
    into ``dest``."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / os.fsdecode(name)
        if src.is_file():
            out = dest / os.fsdecode(name)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)


def _imports_its_own(tree: Path) -> None:
    """A test run in ``tree`` must import the copy's bkref (which cosmic-ray mutates), not
    the checkout's: with ``python -m`` the working directory comes first on sys.path,
    before the venv's editable install of the checkout. Checked, not assumed."""
    where = subprocess.run(
        [sys.executable, "-c", "import bkref, tests; print(bkref.__file__, tests.__path__[0])"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not all(Path(w).resolve().is_relative_to(tree.resolve()) for w in where):
        raise SystemExit(f"a test run in {tree} would import {where}, not the copy's code")


def config_text(target: Target, work: Path) -> str:
    """cosmic-ray's config for ``target``, its test command filled in."""
    command = target.test_command.format(python=sys.executable, work=work)
    lines = [
        "[cosmic-ray]",
        f"module-path = {json.dumps(list(target.modules))}",
        f"timeout = {target.timeout}",
        "excluded-modules = []",
        f"test-command = {json.dumps(command)}",
        "[cosmic-ray.distributor]",
        'name = "local"',
    ]
    return "\n".join(lines) + "\n"


def ran_at() -> str:
    """Today's date and the checkout's short revision, as a report names a run."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"{time.strftime('%Y-%m-%d')} at {head or 'an unknown revision'}"


@contextmanager
def _db(path: Path) -> Iterator[Any]:
    from cosmic_ray.work_db import WorkDB, use_db

    with use_db(str(path), WorkDB.Mode.open) as db:
        yield db


def _key(item: Any) -> tuple[str, str, int]:
    m = item.mutations[0]
    return (str(m.module_path), m.operator_name, m.occurrence)


def _skip(db: Any, job_ids: list[str], why: str) -> None:
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    if job_ids:
        db.set_multiple_results(
            job_ids, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=why)
        )


@dataclass
class Session:
    """A target's sampled session in ``work``: ``shard-K/`` per worker (a tree copy and
    its ``session.sqlite``), ``mutation.toml``, ``meta.json``."""

    target: Target
    work: Path

    @property
    def meta_path(self) -> Path:
        return self.work / "meta.json"

    def shards(self) -> list[Path]:
        return sorted(self.work.glob("shard-*"))

    def meta(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.meta_path.read_text())
        return data

    def matches(self, sample: int, seed: int, workers: int) -> bool:
        if not self.meta_path.exists():
            return False
        m = self.meta()
        want = {"sample": sample, "seed": seed, "workers": workers, "draw": DRAW}
        return all(m.get(k) == v for k, v in want.items()) and m["digest"] == self.target.digest()

    def create(self, sample: int, seed: int, workers: int, *, log: Any = print) -> None:
        """A new session: init in one copy, the sample drawn, one shard per worker. The
        unmutated baseline is kept when the sources and test scripts are the same."""
        baseline = self.work / "baseline.json"
        same = self.meta_path.exists() and self.meta().get("digest") == self.target.digest()
        keep = baseline.read_bytes() if baseline.exists() and same else self._stored_baseline(log)
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        if keep is not None:
            baseline.write_bytes(keep)
        config = self.work / "mutation.toml"
        config.write_text(config_text(self.target, self.work))
        first = self.work / "shard-0"
        copy_tree(first)
        _imports_its_own(first)
        started = time.monotonic()
        subprocess.run(
            [BIN / "cosmic-ray", "init", config, "session.sqlite"], cwd=first, check=True
        )
        excluded = re.compile("|".join(f"(?:{e})" for e in self.target.exclude_operators) or "$^")
        with _db(first / "session.sqlite") as db:
            items = sorted(db.pending_work_items, key=_key)
            kept = [i for i in items if not excluded.match(i.mutations[0].operator_name)]
            chosen, annotations = draw(kept, sample, seed, first)
            ids = {i.job_id for i in chosen}
            _skip(db, [i.job_id for i in items if i.job_id not in ids], SAMPLED_OUT)
        log(
            f"{self.target.name}: {len(items):,} mutants, {len(kept):,} after the operator "
            f"filter, {annotations:,} of them in annotations, {len(chosen)} sampled "
            f"(seed {seed}); init {time.monotonic() - started:.0f} s"
        )
        order = sorted(ids)
        for k in range(1, workers):
            shard = self.work / f"shard-{k}"
            copy_tree(shard)
            shutil.copy2(first / "session.sqlite", shard / "session.sqlite")
        for k in range(workers):
            with _db(self.work / f"shard-{k}" / "session.sqlite") as db:
                _skip(db, [j for n, j in enumerate(order) if n % workers != k], OTHER_SHARD)
        reused = self._reuse(sample, seed, {_key(i): i.job_id for i in chosen})
        seconds, when = 0.0, None
        if reused:
            log(f"{self.target.name}: {reused} results taken from {self.stored.name}")
            stored = json.loads(self.stored.read_text())
            seconds, when = float(stored.get("seconds", 0.0)), stored.get("ran_at")
        self.meta_path.write_text(
            json.dumps(
                {
                    "target": self.target.name,
                    "digest": self.target.digest(),
                    "sample": sample,
                    "seed": seed,
                    "workers": workers,
                    "population": len(items),
                    "filtered": len(kept),
                    "annotations": annotations,
                    "draw": DRAW,
                    "sampled": len(chosen),
                    "seconds": seconds,  # the stored run's, when its results are taken
                    # The tree copied now is the one mutated, whatever HEAD is later: a
                    # resumed session has the same digest (sources, tests, kill scripts).
                    "ran_at": when or ran_at(),
                },
                indent=1,
            )
        )

    @property
    def stored(self) -> Path:
        return STORED / f"{self.target.name}.json"

    @property
    def stored_baseline(self) -> Path:
        return STORED / f"{self.target.name}-baseline.json"

    def _stored_baseline(self, log: Any) -> bytes | None:
        """The baseline kept by :meth:`store` for the same sources and kill scripts: the
        spec's takes most of an hour on two cores, and a session on a new machine would
        otherwise measure it again before its first mutant."""
        path = self.stored_baseline
        data = json.loads(path.read_text()) if path.exists() else {}
        if data.get("digest") != self.target.digest():
            return None
        log(f"{self.target.name}: the unmutated baseline taken from {path.name}")
        return (json.dumps(data["baseline"], indent=1) + "\n").encode()

    def _reuse(self, sample: int, seed: int, jobs: dict[tuple[str, str, int], str]) -> int:
        """Results of the stored run of the same sources, sample and seed, set in the
        shard that holds each job."""
        from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

        if not self.stored.exists():
            return 0
        data = json.loads(self.stored.read_text())
        same = (data["digest"], data["sample"], data["seed"]) == (
            self.target.digest(),
            sample,
            seed,
        )
        if not same:
            return 0
        n = 0
        for shard in self.shards():
            with _db(shard / "session.sqlite") as db:
                mine = {i.job_id for i in db.pending_work_items}
                for r in data["results"]:
                    job = jobs.get((r["module"], r["operator"], r["occurrence"]))
                    if job in mine:
                        db.set_result(
                            job,
                            WorkResult(
                                worker_outcome=WorkerOutcome(r["worker"]),
                                output=r["output"],
                                test_outcome=TestOutcome(r["test"]) if r["test"] else None,
                                diff=r["diff"],
                            ),
                        )
                        n += 1
        return n

    def store(self) -> None:
        """Keep what ran in the repository (outputs cut to their last 2,000 characters)."""
        meta = self.meta()
        results = [dict(r, output=r["output"][-2000:]) for r in self.results()]
        for r in results:
            del r["job"]
        keep = {k: meta[k] for k in ("target", "digest", "sample", "seed", "population")}
        more = ("filtered", "annotations", "sampled", "seconds", "ran_at")
        keep.update({k: meta.get(k) for k in more})
        STORED.mkdir(exist_ok=True)
        self.stored.write_text(json.dumps({**keep, "results": results}, indent=1) + "\n")
        baseline = self.work / "baseline.json"
        if baseline.exists():
            kept = {"digest": meta["digest"], "baseline": json.loads(baseline.read_text())}
            # One line, no spaces: the spec's is most of a megabyte indented.
            self.stored_baseline.write_text(json.dumps(kept, separators=(",", ":")) + "\n")

    def again(self, jobs: set[str], *, log: Any = print) -> None:
        """Run ``jobs`` (survivors, timeouts, errors) again with today's tests. The digest is
        the session's, so only tests changed: each shard gets a fresh copy of the tree, the
        baseline is measured again (its test selection reads each test file's coverage),
        and the jobs' results are cleared. A kill of the first pass stands: a test added
        since can only add kills, as long as no test was weakened (the commits say)."""
        if self.meta().get("digest") != self.target.digest():
            raise SystemExit(f"{self.work}: its sources or kill scripts changed; run it afresh")
        for shard in self.shards():
            copy_tree(shard)
            with sqlite3.connect(shard / "session.sqlite") as db:
                # Only where the job ran: elsewhere its result marks it another shard's.
                db.executemany(
                    "DELETE FROM work_results WHERE job_id = ? AND output NOT IN (?, ?)",
                    [(j, SAMPLED_OUT, OTHER_SHARD) for j in jobs],
                )
        (self.work / "baseline.json").unlink(missing_ok=True)
        meta = self.meta()
        meta.setdefault("again", []).append({"at": ran_at(), "jobs": len(jobs)})
        self.meta_path.write_text(json.dumps(meta, indent=1))
        log(f"{self.target.name}: {len(jobs)} survivors to run again with today's tests")

    def pending(self) -> int:
        n = 0
        for shard in self.shards():
            with _db(shard / "session.sqlite") as db:
                n += len(db.pending_work_items)
        return n

    def run(self, budget: float, *, log: Any = print, every: float = 300.0) -> bool:
        """Exec every shard until all its jobs ran or ``budget`` seconds passed (then
        the execs are stopped; their unfinished jobs stay pending). True when done. The
        progress, logged ``every`` seconds, reads every job's result: 5 CPU s on the spec."""
        config = self.work / "mutation.toml"
        procs: list[subprocess.Popen[bytes]] = []
        for shard in self.shards():
            for src in self.target.sources(shard):  # undo a mutant a stopped exec left
                shutil.copy2(ROOT / src, shard / src)
            with (shard / "exec.log").open("ab") as out:  # the exec keeps its own copy
                procs.append(
                    subprocess.Popen(
                        [BIN / "cosmic-ray", "exec", config, "session.sqlite"],
                        cwd=shard,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        started = last = time.monotonic()
        try:
            while any(p.poll() is None for p in procs):
                time.sleep(2.0)
                now = time.monotonic()
                if now - started >= budget:
                    log(f"{self.target.name}: budget of {budget:.0f} s spent; stopping")
                    break
                if now - last >= every:
                    last = now
                    log(f"{self.target.name}: {self.progress()} after {now - started:.0f} s")
        finally:
            stopped = stop(procs)
            meta = self.meta()
            meta["seconds"] = meta.get("seconds", 0.0) + time.monotonic() - started
            self.meta_path.write_text(json.dumps(meta, indent=1))
        failed = [p.returncode for p in procs if p.returncode != 0 and p.pid not in stopped]
        if failed:
            raise SystemExit(f"cosmic-ray exec failed ({failed}): see {self.work}/shard-*/exec.log")
        return self.pending() == 0

    def results(self) -> list[dict[str, Any]]:
        """Every sampled job that ran: where, what, and its outcome."""
        out: list[dict[str, Any]] = []
        for shard in self.shards():
            with _db(shard / "session.sqlite") as db:
                for item, result in db.completed_work_items:
                    if result.output in (SAMPLED_OUT, OTHER_SHARD):
                        continue
                    m = item.mutations[0]
                    out.append(
                        {
                            "job": item.job_id,
                            "module": str(m.module_path),
                            "operator": m.operator_name,
                            "occurrence": m.occurrence,
                            "line": m.start_pos[0],
                            "column": m.start_pos[1],
                            "definition": m.definition_name,
                            "worker": result.worker_outcome.value,
                            "test": None
                            if result.test_outcome is None
                            else result.test_outcome.value,
                            "output": result.output or "",
                            "diff": result.diff or "",
                        }
                    )
        return sorted(out, key=lambda r: (r["module"], r["line"], r["column"], r["operator"]))

    def progress(self) -> str:
        from tests.mutation.score import outcome

        rs = self.results()
        killed = sum(1 for r in rs if outcome(r) == "killed")
        return (
            f"{len(rs)} of {self.meta()['sampled']} ran, {killed} killed, "
            f"{len(rs) - killed} not killed"
        )
