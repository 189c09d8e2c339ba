"""How a step's label reads: the names traces, the trace check and the refinement machine print."""

from __future__ import annotations

from bkref.spec.protocol import ADD, format_label


def test_labels_spell_out_messages_and_show_ensembles_of_any_size() -> None:
    add = (ADD, 1, 0, -1, 0)
    assert format_label(("bookie_handles_add", (add, 0))) == (
        "bookie_handles_add(add e0 to b1 from writer (lac -1), 0)"
    )
    # An ensemble is a tuple of bookies too; five of them were once shown as a message.
    for ens in ((0, 1, 2), (0, 1, 2, 3, 4), (0, 1, 2, 3, 4, 5)):
        assert format_label(("writer_creates_ledger", (ens,))) == f"writer_creates_ledger({ens})"
    assert format_label(("writer_sends_add", ())) == "writer_sends_add"
    assert format_label(("network_loses_message", (add,))) == (
        "network_loses_message(add e0 to b1 from writer (lac -1))"
    )
