"""Model checker speed per core: the spec at the filing of the scale issue against today's,
pure Python and compiled (bkref/spec/build.py), in one run, taking turns.

Each check is a fresh interpreter (``python -c``) running ``check(cfg, workers=1)`` on one
core; its CPU seconds are the child's own user + system time around the check. The old
revision is exported from git (``git archive``) into a temporary directory and imported
from there: at ``BASE`` the spec was the top-level package ``spec``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TITLE = "Spec model checker: distinct states per CPU second, then and now, pure and compiled"

ROOT = Path(__file__).resolve().parents[2]
# main when the scale issue was filed: its spec-checker figures (config a: 1,110,060 states,
# 198.5 CPU s) are the ones the issue quotes.
BASE = os.environ.get("BKREF_BENCH_SPEC_BASE", "bd2821e")

_CHILD = """
import json, resource, sys, time
pkg, name, max_states = sys.argv[1], sys.argv[2], int(sys.argv[3]) or None
checker = __import__(pkg + ".checker", fromlist=["check"])
configs = __import__(pkg + ".configs", fromlist=["CONFIGS"])
spec = "pure Python"
if pkg == "bkref.spec":
    from bkref.spec.build import running
    spec = running()
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
before, started = cpu(), time.monotonic()
r = checker.check(configs.CONFIGS[name], workers=1, max_states=max_states)
print(json.dumps({"distinct": r.distinct, "explored": r.explored, "cpu": cpu() - before,
                  "seconds": time.monotonic() - started, "violation": r.violation,
                  "file": checker.__file__, "spec": spec}))
"""


def _one(variant: str, old: Path, config: str, max_states: int) -> dict[str, Any]:
    env = dict(os.environ)
    command = [sys.executable, "-c", _CHILD, "bkref.spec", config, str(max_states)]
    cwd = tempfile.gettempdir()  # not the checkout: `spec` must come from the export
    if variant == "then":
        command[3], env["PYTHONPATH"], env["BKREF_SPEC"] = "spec", str(old), "pure"
    elif variant == "floor":  # the bookkeeping alone, fed by the compiled spec (untimed)
        command = [sys.executable, "-m", "tests.bench.spec_floor", config, str(max_states)]
        env["BKREF_SPEC"], cwd = "compiled", str(ROOT)
    else:
        env["BKREF_SPEC"] = "pure" if variant == "now, pure" else "compiled"
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} {config}: {done.stderr[-1500:]}")
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    if variant == "floor":
        return out
    where = str(out["file"])
    if (variant == "then") != where.startswith(str(old)):
        raise RuntimeError(f"{variant} {config} ran the spec at {where}")
    return out


def run(quick: bool) -> str:
    from bkref.spec.build import build, compiler_missing

    why = compiler_missing()
    if why is not None:
        raise RuntimeError(f"the compiled build is one of the variants: {why}")
    build(progress=sys.stderr)
    # quick: a few thousand states of small configs, to prove the machinery works.
    plan = [("c-race", 3000), ("a-short", 3000)] if quick else [("a", 0), ("b", 0)]
    variants = ("then", "now, pure", "now, compiled", "floor")
    rows = [
        "| config | spec | distinct states | explored | CPU s | states / CPU s | vs then |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    budget = [
        "| config | representation | floor: us per state | left for the protocol at 4x "
        "| the protocol today, compiled | cut it needs |",
        "|---|---|---:|---:|---:|---:|",
    ]
    budget_head: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bkref-bench-base-") as tmp:
        old = Path(tmp)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", BASE, "spec"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        for k, (config, max_states) in enumerate(plan):
            order = variants if k % 2 == 0 else variants[::-1]  # take turns
            got = {v: _one(v, old, config, max_states) for v in order}
            floor = got.pop("floor")
            if floor["distinct"] != got["now, compiled"]["distinct"]:
                raise RuntimeError(f"{config}: the floor's BFS saw {floor['distinct']:,} states")
            for kind, name in (("tuple", "nested tuples"), ("bytes", "packed bytes")):
                got[f"floor, {name}"] = {**floor, "cpu": floor["floors"][kind]}
            then = got["then"]["distinct"] / got["then"]["cpu"]
            for v, g in got.items():
                rate = g["distinct"] / g["cpu"]
                if v == "then":
                    label = f"{BASE}, pure Python"
                elif v.startswith("floor"):
                    label = f"{v}: bookkeeping only"
                else:
                    label = g["spec"].split(" (")[0]
                rows.append(
                    f"| `{config}` | {label} | {g['distinct']:,} "
                    f"| {g['explored']:,} | {g['cpu']:.1f} "
                    f"| {rate:,.0f} | {rate / then:.2f}x |"
                )
            per_state = {v: 1e6 * g["cpu"] / g["distinct"] for v, g in got.items()}
            target = 1e6 / (4 * then)
            today = per_state["now, compiled"] - per_state["floor, nested tuples"]
            for name in ("nested tuples", "packed bytes"):
                floor_us = per_state[f"floor, {name}"]
                left = target - floor_us
                cut = f"{today / left:.1f}x" if left > 0 else "more than all of it"
                budget.append(
                    f"| `{config}` | {name} | {floor_us:.1f} | {left:.1f} | {today:.1f} | {cut} |"
                )
            budget_head.append(f"`{config}` {4 * then:,.0f} ({target:.1f} us per state)")
    return (
        "\n".join(rows)
        + f"\n\nOne process each (`workers=1`), in turns (then, now pure, now compiled, floor; the "
        f"next config in the reverse order). `then` is the spec at {BASE} (main when the "
        "scale issue was filed), exported by `git archive`; `now, compiled` is "
        "`bkref spec build`'s mypyc build of today's source (bkref/spec/build.py). The spec "
        "has grown since (new actions, faults and reductions), so distinct counts differ "
        "between then and now; pure and compiled today must agree (tests/spec/test_build.py). "
        "CPU s: the child's user + system time around the check. The floor rows are "
        "tests/bench/spec_floor.py: the same BFS (untimed, compiled), timing only what no "
        "explicit-state BFS escapes, per transition: building the successor from its parent "
        "and looking it up in the visited set; with today's nested tuples, and with each "
        "state packed into bytes (its marshal encoding: hashed once, compared by memcmp).\n\n"
        "4x then is, in distinct states per CPU second: " + ", ".join(budget_head) + ". "
        "What it leaves for the protocol (guards, actions, reductions, the canonical "
        "renaming, invariants) once a representation's bookkeeping is paid, against what "
        "the protocol takes today (the compiled check less its bookkeeping), in "
        "microseconds of CPU per distinct state:\n\n" + "\n".join(budget) + "\n"
    )
