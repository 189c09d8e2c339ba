"""The table of anomaly kinds and messages that both renderings share."""

from __future__ import annotations

import pytest

from bkref.linearizability import anomalies as msg

MESSAGES = [m for m in vars(msg).values() if isinstance(m, msg.Message)] + list(
    msg.TOO_EARLY.values()
)


def test_every_message_is_of_a_known_kind_and_every_kind_has_a_message() -> None:
    assert {m.kind for m in MESSAGES} == set(msg.BY_NAME)
    assert msg.ANOMALY_KINDS == (
        "lost-write",
        "ack-after-fence",
        "divergent-read",
        "read-of-truncated-entry",
        "stale-read",
        "future-read",
        "duplicate",
        "nonmonotonic",
        "disagreeing-closes",
        "skip",
    )


def test_fields_and_rendering() -> None:
    m = msg.READ_UNWRITTEN_DATA
    assert m.fields == ("e", "read")
    assert (
        m.render(e=3, read="it's") == 'entry 3 was read as "it\'s", which no add of entry 3 wrote'
    )
    assert msg.TOO_EARLY[("missing", "close")].fields == ("c", "f", "e")


def test_a_template_takes_named_fields_only() -> None:
    with pytest.raises(ValueError, match="unknown anomaly kind"):
        msg.Message("lost", "entry {e}")
    for bad in ("entry {0}", "entry {e:>4}", "entry {e!s}", "entry {}"):
        with pytest.raises(ValueError, match="fields are"):
            msg.Message("skip", bad)
