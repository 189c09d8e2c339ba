"""Status views of replica health: cluster totals, per ledger, per bookie.

Computed on demand from ZooKeeper (ledger metadata, registered and decommissioning
bookies, the task list), so any node can answer without asking the auditor.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bkref.impl.core.metadata import LedgerMetadata
from bkref.impl.core.repair import Health, Reason, health, live_replicas, segment_range
from bkref.impl.meta.store import NoSuchLedgerError, ZkMetadataStore
from bkref.impl.meta.underreplication import UnderreplicationManager


@dataclass
class LedgerStatus:
    ledger_id: int
    state: str
    health: Health
    live_replicas: int
    write_quorum: int
    bookies: list[str]
    task: dict[str, str] | None  # bad bookie -> reason, when under-replicated
    lock_holder: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger_id,
            "state": self.state,
            "health": self.health.value,
            "live_replicas": self.live_replicas,
            "write_quorum": self.write_quorum,
            "bookies": self.bookies,
            "underreplicated": self.task,
            "lock_holder": self.lock_holder,
        }


@dataclass
class ClusterStatus:
    ledgers: list[LedgerStatus] = field(default_factory=list)
    bookies: dict[str, dict[str, Any]] = field(default_factory=dict)
    enabled: bool = True
    auditor: str | None = None

    def totals(self) -> dict[str, Any]:
        by = Counter(s.health.value for s in self.ledgers)
        return {
            "ledgers": len(self.ledgers),
            "underreplicated": sum(1 for s in self.ledgers if s.task is not None),
            "by_health": {h.value: by.get(h.value, 0) for h in Health},
            "autorecovery": "enabled" if self.enabled else "disabled",
            "auditor": self.auditor,
        }


def _fragment_entries(md: LedgerMetadata) -> Counter[str]:
    """Entries each bookie should store, by metadata."""
    out: Counter[str] = Counter()
    q = md.quorum
    for i, seg in enumerate(md.segments):
        first, last = segment_range(md, i)
        if last is None:
            last = max(md.last_entry, first - 1)
        for e in range(first, last + 1):
            for idx in q.write_set(e):
                out[seg.ensemble[idx]] += 1
    return out


def cluster_status(
    store: ZkMetadataStore, urm: UnderreplicationManager, ledger: int | None = None
) -> ClusterStatus:
    infos = store.bookies()
    live = {b.bookie_id for b in infos}
    leaving = urm.decommissioning()
    tasks = {t.ledger_id: t for t, _ in urm.tasks()}
    redundant = urm.redundant()
    auditor = urm.auditor()
    out = ClusterStatus(enabled=urm.is_enabled(), auditor=auditor.node_id if auditor else None)
    for info in infos:
        out.bookies[info.bookie_id] = {
            "rack": info.rack,
            "state": "read-only" if info.readonly else "writable",
            "decommissioning": info.bookie_id in leaving,
            "ledgers": 0,
            "entries": 0,
        }
    ids = [ledger] if ledger is not None else store.list_ledgers()
    for lid in ids:
        try:
            md, _ = store.read_ledger(lid)
        except NoSuchLedgerError:
            if ledger is not None:
                raise
            continue
        task = tasks.get(lid)
        replicas = task.replicas if task else {}
        missing = [b for b, r in replicas.items() if r is Reason.ENTRIES_MISSING]
        out.ledgers.append(
            LedgerStatus(
                lid,
                md.state.value,
                health(
                    md,
                    live,
                    leaving=leaving,
                    entries_missing=missing,
                    redundant=redundant.get(lid, ()),
                ),
                live_replicas(md, live),
                md.write_quorum,
                sorted(md.bookies()),
                {b: r.value for b, r in task.replicas.items()} if task else None,
                urm.lock_holder(lid) if task else None,
            )
        )
        for b, n in _fragment_entries(md).items():
            row = out.bookies.setdefault(
                b,
                {
                    "rack": "?",
                    "state": "missing",
                    "decommissioning": b in leaving,
                    "ledgers": 0,
                    "entries": 0,
                },
            )
            row["ledgers"] += 1
            row["entries"] += n
    return out
