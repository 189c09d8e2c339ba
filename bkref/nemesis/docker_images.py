"""The node image of Docker campaigns, built from local files only.

No image registry is reachable and containers have no egress, so:

1. the base is a Debian bookworm root filesystem made by ``debootstrap
   --variant=minbase`` plus the node's packages installed in a chroot
   (``bkref/docker/build-base.sh``), tarred and cached under
   ``~/.cache/bkref/docker/`` by a hash of the package list and the script,
   then ``docker import``-ed as ``bkref-base:<hash>``;
2. ``bkref/docker/Dockerfile`` adds a venv with bkref and the dependencies node
   processes import (kazoo, crc32c, prometheus-client; orjson and rich for the client
   role), from wheels built on the host (the host's python3 is bookworm's 3.11).

A second build reuses the cached tarball, the imported base and Docker's
layer cache: only the layer with bkref's own wheel is rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

PACKAGE = Path(__file__).resolve().parents[1]  # the bkref package, installed or in a checkout
DOCKER_DIR = PACKAGE / "docker"
IMAGE = "bkref-node:latest"
# What the node containers run: ZooKeeper (a JRE and Debian's jars), bookies and
# AutoRecovery (python3 + venv), faults from inside (iproute2, iptables, procps).
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "iproute2",
    "iptables",
    "procps",
    "default-jre-headless",
    "zookeeper",
)
# Python packages node processes import (impl: kazoo, crc32c, prometheus-client; the client
# role: orjson, rich).
NODE_REQUIREMENTS = (
    "kazoo>=2.10",
    "crc32c>=2.4",
    "prometheus-client>=0.20",
    "orjson>=3.9",
    "rich>=13",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class ImageError(RuntimeError):
    """The node image could not be built."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bkref" / "docker"


def base_key() -> str:
    """Names a base tarball: a new package list or build script makes a new one."""
    h = hashlib.sha256()
    h.update("\n".join(BASE_PACKAGES).encode())
    h.update((DOCKER_DIR / "build-base.sh").read_bytes())
    return h.hexdigest()[:12]


def debian_mirror(sources: Path = Path("/etc/apt/sources.list.d/debian.sources")) -> str:
    """The Debian mirror apt uses here (deb822 ``URIs:`` of the main archive)."""
    try:
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    except OSError:
        pass
    return DEFAULT_MIRROR


@dataclass
class BuildTimes:
    """Seconds each step of a build took (zero: it was cached)."""

    steps: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.steps.values())

    def __str__(self) -> str:
        parts = ", ".join(f"{k} {v:.1f}s" for k, v in self.steps.items())
        return f"{self.total:.1f}s ({parts})"


def _timed(times: BuildTimes, step: str, t0: float) -> None:
    times.steps[step] = time.monotonic() - t0


def base_tarball(times: BuildTimes, *, log: Path | None = None) -> Path:
    """The cached base tarball, made by debootstrap if missing (minutes, needs root)."""
    tar = cache_dir() / f"base-{base_key()}.tar"
    if tar.exists():
        return tar
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed; run `make docker-setup`")
    tar.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    argv = ["bash", str(DOCKER_DIR / "build-base.sh"), str(tar), debian_mirror(), *BASE_PACKAGES]
    out = log.open("ab") if log is not None else None
    try:
        done = subprocess.run(
            argv, check=False, stdout=out, stderr=subprocess.STDOUT if out else None
        )
    finally:
        if out is not None:
            out.close()
    if done.returncode != 0:
        raise ImageError(f"{' '.join(argv[:3])} ... failed ({done.returncode}); see {log}")
    _timed(times, "debootstrap", t0)
    return tar


def wheels(directory: Path, times: BuildTimes) -> None:
    """Wheels of the node requirements (cached) and of bkref itself into ``directory``."""
    deps = cache_dir() / (
        "wheels-" + hashlib.sha256(repr(NODE_REQUIREMENTS).encode()).hexdigest()[:12]
    )
    if not deps.exists():
        t0 = time.monotonic()
        part = deps.with_suffix(".part")
        shutil.rmtree(part, ignore_errors=True)
        _pip(["wheel", "-q", "-w", str(part), *NODE_REQUIREMENTS])
        part.rename(deps)
        _timed(times, "dependency wheels", t0)
    shutil.copytree(deps, directory / "deps")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bkref-wheel-") as tmp:
        _pip(["wheel", "-q", "--no-deps", "-w", str(directory / "bkref"), str(stage(Path(tmp)))])
    _timed(times, "bkref wheel", t0)


def stage(directory: Path) -> Path:
    """A project to build bkref's wheel from: the package's files and a pyproject.toml
    made from the installed distribution's metadata (version, the ``bkref`` script and
    its subcommands). The same whether bkref is installed from a wheel or editable from
    a checkout, so that the image can be built from either."""
    dist = importlib.metadata.distribution("bkref")
    groups: dict[str, dict[str, str]] = {}
    for ep in dist.entry_points:
        groups.setdefault(ep.group, {})[ep.name] = ep.value
    scripts = groups.pop("console_scripts", {})
    lines = [
        "[build-system]",
        'requires = ["setuptools>=77"]',
        'build-backend = "setuptools.build_meta"',
        "[project]",
        'name = "bkref"',
        f"version = {json.dumps(dist.version)}",
        "[project.scripts]",
        *(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in sorted(scripts.items())),
    ]
    for group, eps in sorted(groups.items()):
        lines.append(f"[project.entry-points.{json.dumps(group)}]")
        lines += [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in sorted(eps.items())]
    lines += [
        "[tool.setuptools.packages.find]",
        'include = ["bkref*"]',
        "[tool.setuptools.package-data]",
        '"*" = ["*"]',
    ]
    shutil.copytree(
        PACKAGE, directory / "bkref", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    (directory / "pyproject.toml").write_text("\n".join(lines) + "\n")
    return directory


def _pip(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise ImageError(f"pip {' '.join(args[:3])} failed: {done.stderr.strip()[-2000:]}")


def build(docker: DockerClient, *, log: Path | None = None) -> BuildTimes:
    """Build (or refresh) ``bkref-node:latest`` in the engine ``docker`` talks to."""
    times = BuildTimes()
    tar = base_tarball(times, log=log)
    base = f"bkref-base:{base_key()}"
    if not docker.image.exists(base):
        t0 = time.monotonic()
        docker.image.import_(tar, tag=base)
        _timed(times, "docker import", t0)
    with tempfile.TemporaryDirectory(prefix="bkref-image-") as tmp:
        context = Path(tmp)
        shutil.copy2(DOCKER_DIR / "Dockerfile", context / "Dockerfile")
        shutil.copy2(DOCKER_DIR / "bkref-node", context / "bkref-node")
        (context / "bkref-node").chmod(0o755)  # an installed wheel need not keep the mode
        wheels(context / "wheels", times)
        t0 = time.monotonic()
        # The classic builder: Debian's engine has no BuildKit plugin for this client.
        os.environ["DOCKER_BUILDKIT"] = "0"
        try:
            docker.legacy_build(context, build_args={"BASE": base}, tags=[IMAGE])
        except DockerException as e:
            raise ImageError(f"docker build failed: {e}") from e
        _timed(times, "docker build", t0)
    return times


def image_size(docker: DockerClient) -> int:
    return int(docker.image.inspect(IMAGE).size)
