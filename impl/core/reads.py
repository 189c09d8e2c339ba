"""Which bookies a reader asks, and in what order."""

from __future__ import annotations

from impl.core.metadata import LedgerMetadata


def read_order(
    metadata: LedgerMetadata, entry_id: int, avoid: frozenset[str] = frozenset()
) -> list[str]:
    """The entry's write set, first choice first; bookies in ``avoid`` go last."""
    ensemble = metadata.ensemble_for(entry_id)
    order = [ensemble[i] for i in metadata.quorum.write_set(entry_id)]
    return [b for b in order if b not in avoid] + [b for b in order if b in avoid]
