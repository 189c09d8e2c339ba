"""Creating a cluster's fixed znodes in few requests.

A bookie, an auditor and every worker create the layout they need at start, and the
refinement machine does it for every example. ``KazooClient.ensure_path`` costs a
round trip per existing ancestor and two per missing znode, one after another; here
every path and ancestor is asked about at once (pipelined), and the missing ones are
created in one multi, parents first.
"""

from __future__ import annotations

from collections.abc import Iterable

from kazoo.client import KazooClient


def _with_ancestors(paths: Iterable[str]) -> list[str]:
    out: set[str] = set()
    for p in paths:
        parts = p.strip("/").split("/")
        out.update("/" + "/".join(parts[: i + 1]) for i in range(len(parts)))
    return sorted(out, key=lambda p: (p.count("/"), p))


def ensure_paths(zk: KazooClient, paths: Iterable[str]) -> None:
    """Make sure each of ``paths`` exists, with its ancestors (idempotent, and safe
    against another client creating some of them at the same time)."""
    wanted = _with_ancestors(paths)
    asks = [(p, zk.exists_async(p)) for p in wanted]
    missing = [p for p, ask in asks if ask.get() is None]
    if not missing:
        return
    t = zk.transaction()
    for p in missing:
        t.create(p, b"")
    if any(isinstance(r, Exception) for r in t.commit()):
        # Someone else created one in between: the multi did nothing; go one by one.
        for p in missing:
            zk.ensure_path(p)
