"""Cookies: a bookie's identity in each of its directories and in ZooKeeper.

On first start the bookie writes the same cookie (cluster instance id, bookie
id, its directories) to ``<dir>/current/VERSION`` and to
``/ledgers/cookies/<bookie id>``. Later starts must find all of them and
equal: a wiped or swapped disk would otherwise rejoin as an empty bookie and
silently lose the replicas that the ledger metadata says it holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bkref.impl.meta.store import ZkMetadataStore

COOKIE_VERSION = 1


class CookieMismatchError(RuntimeError):
    pass


def _file(directory: str) -> Path:
    return Path(directory) / "current" / "VERSION"


def make_cookie(
    instance_id: str, bookie_id: str, journal_dir: str, ledger_dirs: list[str]
) -> dict[str, Any]:
    return {
        "layoutVersion": COOKIE_VERSION,
        "instanceId": instance_id,
        "bookieHost": bookie_id,
        "journalDir": journal_dir,
        "ledgerDirs": list(ledger_dirs),
    }


def _write_local(directory: str, cookie: dict[str, Any]) -> None:
    p = _file(directory)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    with tmp.open("w") as f:
        json.dump(cookie, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(p)


def _read_local(directory: str) -> dict[str, Any] | None:
    p = _file(directory)
    if not p.exists():
        return None
    try:
        return dict(json.loads(p.read_text()))
    except ValueError as e:
        raise CookieMismatchError(
            f"cookie {p} is unreadable ({e}); the directory is damaged"
        ) from e


def verify_or_create(
    store: ZkMetadataStore, bookie_id: str, journal_dir: str, ledger_dirs: list[str]
) -> dict[str, Any]:
    """Check the cookies (or write them on a first start); raise with what to do if wrong."""
    instance = store.instance_id()
    expected = make_cookie(instance, bookie_id, journal_dir, ledger_dirs)
    dirs = [journal_dir, *ledger_dirs]
    local = {d: _read_local(d) for d in dirs}
    found = store.read_cookie(bookie_id)
    remote = None if found is None else found[0]
    if remote is None and all(c is None for c in local.values()):
        for d in dirs:
            _write_local(d, expected)
        store.write_cookie(bookie_id, expected)
        return expected
    if remote is None:
        raise CookieMismatchError(
            f"cookie mismatch for bookie {bookie_id}: its directories have cookies but "
            f"ZooKeeper has none at {store.root}/cookies/{bookie_id}; these directories "
            "belong to another cluster (or ZooKeeper was wiped). Point the bookie at its "
            "own cluster, or clear the directories to join this one as a new bookie."
        )
    missing = [d for d, c in local.items() if c is None]
    if missing:
        raise CookieMismatchError(
            f"cookie mismatch for bookie {bookie_id}: directory {', '.join(missing)} has no "
            f"cookie but ZooKeeper has one: the disk was wiped or swapped, and its replicas "
            "are gone. Refusing to start. Decommission this bookie (re-replicate its "
            "ledgers), then delete its cookie from ZooKeeper to add it back as a new bookie."
        )
    for d, c in local.items():
        if c != remote:
            diff = sorted(
                k for k in set(remote) | set(c or {}) if (c or {}).get(k) != remote.get(k)
            )
            raise CookieMismatchError(
                f"cookie mismatch for bookie {bookie_id}: the cookie in {d} differs from "
                f"ZooKeeper's in {', '.join(diff)}: directories swapped between bookies or "
                "clusters. Refusing to start."
            )
    if remote != expected:
        diff = sorted(k for k in expected if expected.get(k) != remote.get(k))
        raise CookieMismatchError(
            f"cookie mismatch for bookie {bookie_id}: the configuration changed "
            f"({', '.join(diff)}) since the cookie was written. Refusing to start."
        )
    return remote
