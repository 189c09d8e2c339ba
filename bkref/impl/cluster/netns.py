"""Run a function inside a Linux network namespace, from a thread of this process.

Network namespaces are per thread: ``setns(2)`` in a fresh thread moves only
that thread, and the sockets and threads it creates stay in that namespace
(a kazoo client started there keeps its connection thread there). This lets
one control process talk to servers in several private namespaces, for
example ZooKeeper servers of a local campaign, without touching the host's
network namespace.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"


class NetnsEnterError(OSError):
    """setns(2) into a named network namespace failed."""


def _setns(netns: str) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    path = os.path.join(NETNS_DIR, netns)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsEnterError(f"no network namespace {netns!r} ({path} does not exist)") from None
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsEnterError(err, f"setns into {netns!r} failed: {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """Call ``fn`` in a new thread that has entered ``netns`` (None: call it here)."""
    if netns is None:
        return fn()
    results: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            _setns(netns)
            results.append(fn())
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)

    thread = threading.Thread(target=target, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]
