"""One engine directory for the Docker tests of a session.

Each test starts and stops its own engine (a campaign's backend stops the engine it
started, and its test holds it to that); the directory, with the images in its data root,
outlives them. So the node image is built once per session: the image test builds it,
and a campaign after it finds its layers there, instead of importing the base and
installing bkref again (a build is tens of CPU seconds beside `make verify`'s suite).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def engine_dir() -> Iterator[Path]:
    # Short, under /tmp: containerd's sockets live under it.
    directory = Path("/tmp") / f"bkref-dk-{os.getpid()}"
    yield directory
    shutil.rmtree(directory, ignore_errors=True)  # its images: a GB or so
