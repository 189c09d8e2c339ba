"""What a bookie stores, read offline from its directories: the input of replication audits.

One JSON Lines row per stored entry, in the format ``bkref/spark_checks/replication.py``
reads (its ``entries`` table)::

    {"bookie": "127.0.0.1:3181", "ledger": 7, "entry": 0, "digest": "9a0364b9"}

``digest`` is the entry's content fingerprint (``bkref.impl.core.digest.content_fingerprint``):
replicas of one entry compare equal exactly when they hold the same ids, length and
data, whatever LAC each piggybacks (a recovery's write-back carries its own, as in
BookKeeper), and a copy with any flipped byte matches no good copy; an entry the
bookie indexes but cannot read back gets the digest ``unreadable`` (and an ``error``),
which matches no good copy either. The bookie must be stopped: opening its
storage replays the journal, as a restart would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bkref.impl.bookie.config import BookieConfig
from bkref.impl.core.digest import content_fingerprint
from bkref.impl.storage.bookie_storage import BookieStorage

UNREADABLE = "unreadable"


def stored_entries(config: BookieConfig) -> Iterator[dict[str, Any]]:
    storage = BookieStorage(
        Path(config.journalDirectory), Path(config.ledgerDirectories[0]), config.storage()
    )
    try:
        for ledger in sorted(storage.ledger_ids()):
            ix = storage.index.ledgers[ledger]
            for entry in sorted(ix.entries):
                row: dict[str, Any] = {"bookie": config.bookie_id, "ledger": ledger, "entry": entry}
                try:
                    body = storage.read_entry(ledger, entry)
                except OSError as e:
                    # A corrupt record (a flipped length, a cut log) is this replica's
                    # finding, not the end of the dump: the rest of the bookie still counts.
                    yield {**row, "digest": UNREADABLE, "error": str(e)}
                    continue
                if body is None:
                    continue
                yield {**row, "digest": content_fingerprint(body)}
    finally:
        storage.close()


def dump(config: BookieConfig, out: Path) -> int:
    """Append the bookie's rows to ``out``; returns how many."""
    n = 0
    with out.open("a") as f:
        for row in stored_entries(config):
            f.write(json.dumps(row) + "\n")
            n += 1
    return n
