"""How a step's label reads: the names traces, the trace check and the refinement machine print."""

from __future__ import annotations

from bkref.spec.configs import NAMED
from bkref.spec.protocol import (
    ADD,
    W_CLOSED,
    W_NAMES,
    W_NONE,
    W_OPEN,
    W_WITHDRAWN,
    format_label,
    initial_state,
    next_states,
)
from bkref.spec.trace import describe


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


def test_a_trace_names_each_writer_status_by_its_own_name() -> None:
    # The constants index W_NAMES: a renumbered status would print under another's name.
    statuses = (W_NONE, W_OPEN, W_CLOSED, W_WITHDRAWN)
    assert [W_NAMES[x] for x in statuses] == ["NONE", "OPEN", "CLOSED", "WITHDRAWN"]
    cfg = NAMED["a-short"]
    s = initial_state(cfg)
    assert describe(s)["writer.status"] == "NONE"  # its ledger not yet created
    opened = next(t for label, t in next_states(cfg, s) if label[0] == "writer_creates_ledger")
    assert describe(opened)["writer.status"] == "OPEN"
