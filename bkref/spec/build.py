"""A compiled build of the spec and its checker (mypyc), used instead of the source when current.

The spec stays the readable Python of this package, and the oracle. mypyc compiles that
same source, unchanged, into C extension modules that run it with fewer interpreter steps
per state: `bkref spec build` compiles the modules in ``MODULES`` into a directory of
their own, named by a hash of their source (``build_dir``). ``activate``, called by the
package's ``__init__`` before any module of it is imported, puts that directory first on
the package's search path when the environment allows it and the build is complete:

- ``BKREF_SPEC=auto`` (the default): the build of exactly this source if there is one,
  else the source. Any edit of a compiled module (a mutant's too) changes the hash, so a
  stale build is never run;
- ``BKREF_SPEC=pure``: the source, always (the test suite's default: its monkeypatches
  and tracers need Python functions; tests/spec/test_build.py compares the two);
- ``BKREF_SPEC=compiled``: the build, or an ImportError that says how to make one.

Builds live under ``BKREF_SPEC_BUILD_DIR`` (default ``$XDG_CACHE_HOME/bkref/spec-build``,
``~/.cache/bkref/spec-build``). Stdlib only, as the rest of the spec.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import TextIO

# The modules compiled together (one mypyc group: calls between them are C calls). The
# rest of the package (cli, coverage, liveness, configs, ...) runs as Python and imports
# these as any module.
MODULES = ("config", "quorum", "protocol", "symmetry", "invariants", "visited", "checker")
# Imported by a compiled module, read by mypyc for its types, not compiled: this module
# and the checker's checkpoints (file I/O, once a level).
TYPES_ONLY = ("build", "checkpoint")
PACKAGE_DIR = Path(__file__).resolve().parent
MODES = ("auto", "pure", "compiled")
READY = "READY"  # written last: a build without it is incomplete and never used


def mode() -> str:
    """``BKREF_SPEC``: auto, pure or compiled."""
    m = os.environ.get("BKREF_SPEC", "auto") or "auto"
    if m not in MODES:
        raise ImportError(f"BKREF_SPEC={m!r} is not one of {', '.join(MODES)}: unset it or fix it")
    return m


def root() -> Path:
    """Where builds are kept, one directory per source hash."""
    given = os.environ.get("BKREF_SPEC_BUILD_DIR")
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "bkref" / "spec-build"


def source_hash() -> str:
    """A hash of what a build is compiled from: the modules' source, the interpreter's ABI."""
    h = hashlib.sha256(f"{sys.implementation.cache_tag} {sys.platform} {MODULES}".encode())
    for name in MODULES:
        h.update(b"\0" + name.encode() + b"\0")
        h.update((PACKAGE_DIR / f"{name}.py").read_bytes())
    return h.hexdigest()[:20]


def build_dir() -> Path:
    """The directory of the build of this source (complete or not, present or not)."""
    return root() / source_hash()


def activate(path: list[str]) -> list[str]:
    """The package's search path: with the current build's directory first when it is to be
    used (see the module docstring); the build's shared library goes on ``sys.path``."""
    m = mode()
    if m == "pure":
        return path
    d = build_dir()
    if not (d / READY).is_file():
        if m == "compiled":
            raise ImportError(
                f"BKREF_SPEC=compiled, but there is no build of this spec's source at {d}: "
                "run `bkref spec build`, or unset BKREF_SPEC to run the source"
            )
        return path
    if str(d) not in sys.path:
        sys.path.append(str(d))  # the group's shared library: a top-level module
    return [str(d / "bkref" / "spec"), *path]


def running() -> str:
    """What this process runs: 'compiled (mypyc, DIR)' or 'pure Python (why)'."""
    spec = importlib.util.find_spec("bkref.spec.protocol")
    origin = spec.origin if spec is not None else None
    if origin is not None and not origin.endswith(".py"):
        return f"compiled (mypyc, {Path(origin).parent.parent.parent})"
    if mode() == "pure":
        return "pure Python (BKREF_SPEC=pure)"
    return "pure Python (no build of this source: `bkref spec build` makes one)"


def require_source(module: str, argv: list[str]) -> None:
    """Run ``python -m module argv`` again on the source if this process runs the build: the
    docs and examples read docstrings and source lines, which a compiled module lacks."""
    if running().startswith("compiled"):
        env = {**os.environ, "BKREF_SPEC": "pure"}
        os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)  # noqa: S606


def compiler_missing() -> str | None:
    """Why this machine cannot build, or None."""
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc is not installed (it ships with mypy: pip install mypy)"
    if not any(shutil.which(cc) for cc in (os.environ.get("CC", "cc"), "cc", "gcc", "clang")):
        return "no C compiler (cc, gcc or clang) on PATH"
    if not Path(sysconfig.get_paths()["include"], "Python.h").is_file():
        return "the Python headers (Python.h) are missing: install python3-dev"
    return None


def build(progress: TextIO | None = sys.stderr, *, force: bool = False) -> Path:
    """Compile ``MODULES`` into ``build_dir()`` (if no complete build is there, or ``force``);
    return it. Raises RuntimeError with mypyc's output when compiling fails. Processes that
    build at once take turns (a lock file): the second finds the first's build current."""
    import fcntl  # here, not at the top: every import of the package reads this module

    dest = build_dir()
    if (dest / READY).is_file() and not force:
        if progress is not None:
            print(f"spec build: current ({dest})", file=progress)
        return dest
    why = compiler_missing()
    if why is not None:
        raise RuntimeError(f"cannot compile the spec: {why}; the spec runs as pure Python")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / READY).is_file() and not force:
            return dest  # built by another process while this one waited
        _compile(dest, progress)
    return dest


def _compile(dest: Path, progress: TextIO | None) -> None:
    import subprocess
    import tempfile

    work = Path(tempfile.mkdtemp(prefix=".building-", dir=dest.parent))
    try:
        pkg = work / "bkref" / "spec"
        pkg.mkdir(parents=True)
        # mypyc names a module by its package: the package markers, empty, and the modules.
        (work / "bkref" / "__init__.py").write_text("")
        (pkg / "__init__.py").write_text("")
        for name in (*MODULES, *TYPES_ONLY):
            shutil.copyfile(PACKAGE_DIR / f"{name}.py", pkg / f"{name}.py")
        if progress is not None:
            print(
                f"spec build: compiling {len(MODULES)} modules with mypyc (about 2 CPU "
                "minutes) ...",
                file=progress,
                flush=True,
            )
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "mypyc", *(f"bkref/spec/{m}.py" for m in MODULES)],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
            raise RuntimeError(f"mypyc failed (exit {done.returncode}):\n{tail}")
        shutil.rmtree(work / "build")  # the C sources and objects: tens of MB
        for name in (*MODULES, *TYPES_ONLY):
            (pkg / f"{name}.py").unlink()  # the build holds extension modules only
        seconds = time.monotonic() - started
        (work / READY).write_text(f"source {dest.name}\nseconds {seconds:.0f}\n")
        shutil.rmtree(dest, ignore_errors=True)  # an incomplete build, or --force
        work.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if progress is not None:
        print(f"spec build: done in {seconds:.0f} s ({dest})", file=progress)
