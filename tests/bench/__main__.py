"""Run the benchmarks and write their sections into BENCHMARKS.md.

    python -m tests.bench [--quick] [--only NAME ...] [--out FILE]

Sections are delimited by ``<!-- bench:NAME -->`` markers; running a subset
replaces only those sections and keeps the others.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import platform
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores{mem}; Linux {platform.release()}; "
        f"Python {platform.python_version()}"
    )


def _modules() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not numbers")
    p.add_argument("--only", nargs="*", default=None, help=f"sections to run: {_modules()}")
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = p.parse_args(argv)
    names = args.only or _modules()
    unknown = sorted(set(names) - set(_modules()))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {_modules()}", file=sys.stderr)
        return 2
    # The BKREF_BENCH_* settings choose sizes: they are part of the command.
    settings = [f"{k}={v} " for k, v in sorted(os.environ.items()) if k.startswith("BKREF_BENCH_")]
    command = "".join(settings) + "python -m tests.bench "
    command += " ".join(argv if argv is not None else sys.argv[1:])
    for name in names:
        module = importlib.import_module(f"tests.bench.bench_{name}")
        print(f"== {module.TITLE}", flush=True)
        started = time.monotonic()
        body = module.run(args.quick)
        took = time.monotonic() - started
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        section = (
            f"<!-- bench:{name} -->\n## {module.TITLE}\n\n"
            f"Measured {stamp} on {_machine()}.\nCommand: `{command.strip()}` "
            f"({'quick' if args.quick else 'full'} run, {took:.0f} s).\n\n{body.strip()}\n"
            f"<!-- /bench:{name} -->"
        )
        # Read the file only now: a benchmark takes minutes, and a section another run
        # wrote meanwhile (another `--only`) must survive this one.
        text = args.out.read_text() if args.out.exists() else ""
        pattern = re.compile(rf"<!-- bench:{name} -->.*?<!-- /bench:{name} -->", re.S)
        if pattern.search(text):
            text = pattern.sub(lambda _m, new=section: new, text)
        else:
            text = text.rstrip() + ("\n\n" if text.strip() else "") + section + "\n"
        if not text.startswith("# Benchmarks"):
            text = (
                "# Benchmarks\n\nWritten by `make bench` (`python -m tests.bench`); "
                "each section says the machine and the command.\n\n" + text
            )
        args.out.write_text(text)
        print(body.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
