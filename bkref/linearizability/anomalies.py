"""Every anomaly the checkers report: its kind, what it means, and its messages.

One table for both renderings: the single-process checkers
(:mod:`bkref.linearizability.ledger_checker`, :mod:`bkref.linearizability.durability`,
:mod:`bkref.linearizability.replication`) format a :class:`Message` with
:meth:`Message.render`, and the Spark jobs turn the same template into a column
expression (:mod:`bkref.spark_checks.messages`), so that the two give the same words
by construction; ``tests/spark_checks/test_equivalence.py`` holds their
verdicts and messages together.

A template is a :meth:`str.format` string of named fields with no format
spec; ``!r`` quotes a text field as Python's ``repr`` does (for printable
text). :attr:`Message.fields` lists the fields a template takes.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Kind:
    """An anomaly kind: its name (Jepsen's where one fits), what it means and
    the checks that report it."""

    name: str
    meaning: str
    checks: tuple[str, ...]


LINEARIZABLE: Final = "linearizable"
DURABILITY: Final = "durability"
REPLICATION: Final = "replication"
GENERIC: Final = "generic"
CONVERGENCE: Final = "convergence"  # a campaign's repair after the heal (nemesis.checker)
TRACE: Final = "trace"  # a campaign's traces replayed through the spec (bkref.tracecheck)

KINDS: Final = (
    Kind(
        "lost-write",
        "an acknowledged entry is beyond the last entry a close or recovery fixed, "
        "or a final read found no such entry",
        (LINEARIZABLE, DURABILITY),
    ),
    Kind(
        "ack-after-fence",
        "an add sent after a close or recovery had completed was acknowledged",
        (LINEARIZABLE,),
    ),
    Kind(
        "divergent-read",
        "an entry read with data its add did not write, or read with two different data",
        (LINEARIZABLE, DURABILITY),
    ),
    Kind(
        "read-of-truncated-entry",
        "an entry (or LAC) read beyond the last entry a close or recovery fixed",
        (LINEARIZABLE, DURABILITY),
    ),
    Kind(
        "stale-read",
        '"no such entry" for an entry known to exist before the read began',
        (LINEARIZABLE,),
    ),
    Kind(
        "future-read",
        "an entry, LAC or last entry returned before the add it depends on was invoked "
        "(or the ledger's create), or an entry read that no add wrote",
        (LINEARIZABLE,),
    ),
    Kind(
        "duplicate",
        "two acknowledged adds of one entry id, or two creates returning one ledger id",
        (LINEARIZABLE, DURABILITY),
    ),
    Kind(
        "nonmonotonic",
        "an add was acknowledged before the add of a smaller entry id was sent",
        (LINEARIZABLE,),
    ),
    Kind(
        "disagreeing-closes",
        "two closes or recoveries with different last entries",
        (LINEARIZABLE,),
    ),
    Kind("skip", "an entry id below a proven one that no add ever wrote", (LINEARIZABLE,)),
    Kind(
        "under-replicated",
        "a bookie of an entry's write set does not store it",
        (REPLICATION, CONVERGENCE),
    ),
    Kind(
        "not-repaired-after-heal",
        "AutoRecovery did not repair every ledger within the campaign's convergence phase",
        (CONVERGENCE,),
    ),
    Kind(
        "digest-mismatch",
        "the copies of an entry on its write set differ",
        (REPLICATION,),
    ),
    Kind(
        "nonlinearizable",
        "a key's operations have no linearization (the generic search)",
        (GENERIC,),
    ),
    Kind(
        "trace-violation",
        "a protocol step a node logged that no behaviour of the spec allows",
        (TRACE,),
    ),
)
BY_NAME: Final = {k.name: k for k in KINDS}
# The ledger checker's kinds, in the order of its docstring (the kinds ``bkref
# gen-history --anomaly`` plants).
ANOMALY_KINDS: Final = tuple(k.name for k in KINDS if LINEARIZABLE in k.checks)


@dataclass(frozen=True)
class Message:
    """A message of one anomaly kind, as a :meth:`str.format` template."""

    kind: str
    template: str

    def __post_init__(self) -> None:
        if self.kind not in BY_NAME:
            raise ValueError(f"unknown anomaly kind {self.kind!r}")
        for _, name, spec, conversion in string.Formatter().parse(self.template):
            if name is not None and (
                not name.isidentifier() or spec or conversion not in (None, "r")
            ):
                raise ValueError(f"{self.template!r}: fields are {{name}} or {{name!r}}")

    @property
    def parts(self) -> tuple[tuple[str, str | None, bool], ...]:
        """(literal text, field or None, quoted as repr) in order: what a
        renderer other than :meth:`str.format` joins."""
        return tuple(
            (text, name, conversion == "r")
            for text, name, _, conversion in string.Formatter().parse(self.template)
        )

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields the template takes, each once, in order."""
        return tuple(dict.fromkeys(name for _, name, _ in self.parts if name is not None))

    def render(self, **values: object) -> str:
        return self.template.format(**values)


# ---------------------------------------------------------------- the ledger checker
# Fields: ``e`` an entry id, ``f`` the operation that closed the ledger (close or
# recover), ``closed_at`` its last entry, ``data`` and ``read`` payloads.

DUPLICATE_CREATES: Final = Message("duplicate", "{n} creates returned ledger {ledger}")
DISAGREEING_CLOSES: Final = Message(
    "disagreeing-closes", "{first_f} closed at entry {first_last} but {f} at entry {last}"
)
DUPLICATE_ADDS: Final = Message("duplicate", "two adds of entry {e} were acknowledged")
DIVERGENT_READS: Final = Message("divergent-read", "entry {e} read as {read!r} and as {other!r}")
ACK_AFTER_FENCE: Final = Message(
    "ack-after-fence",
    "add of entry {e} was sent after {f} closed the ledger at {closed_at}, and acknowledged",
)
# also the durability check's, with f "recovery"
LOST_BEYOND_CLOSE: Final = Message(
    "lost-write", "entry {e} was acknowledged but {f} closed the ledger at {closed_at}"
)
READ_BEYOND_CLOSE: Final = Message(
    "read-of-truncated-entry", "entry {e} was read but {f} closed the ledger at {closed_at}"
)
LAC_BEYOND_CLOSE: Final = Message(
    "read-of-truncated-entry", "LAC {e} was read but {f} closed the ledger at {closed_at}"
)
SKIPPED_RANGE: Final = Message(
    "skip", "entries {first}..{last} were never written, yet {last} exists"
)
SKIPPED: Final = Message("skip", "entry {e} was never written, yet a later entry exists")
READ_UNWRITTEN_DATA: Final = Message(
    "divergent-read", "entry {e} was read as {read!r}, which no add of entry {e} wrote"
)
READ_NEVER_WRITTEN: Final = Message("future-read", "entry {e} was read but never written")
READ_OTHER_DATA: Final = Message(
    "divergent-read", "entry {e} was written as {data!r} but read as {read!r}"
)

# An operation completed no later than the invocation of one that must precede
# it, by (cause, victim). Causes: the ledger's ``create``, the latest ``add`` of
# the chain up to the victim's entry, the latest "no such entry" read
# (``missing``) of an entry up to it. Victims: an ``add``, a ``read`` that found
# its entry, a ``lac`` read, a ``close`` or recovery. Fields: ``e`` the victim's
# entry (its LAC, its last entry), ``c`` the entry the cause names, ``f`` the
# victim's operation (close or recover).
_BEFORE_CREATE: Final = " completed before the ledger's create was invoked"
_NOT_INVOKED: Final = " before the add of entry {c} was invoked"
_NO_SUCH: Final = "no such entry {c} in a read that began after "
TOO_EARLY: Final = {
    ("create", "add"): Message("future-read", "add of entry {e}" + _BEFORE_CREATE),
    ("create", "read"): Message("future-read", "read of entry {e}" + _BEFORE_CREATE),
    ("create", "lac"): Message("future-read", "read_lac" + _BEFORE_CREATE),
    ("create", "close"): Message("future-read", "{f}" + _BEFORE_CREATE),
    ("add", "add"): Message("nonmonotonic", "add of entry {e} was acknowledged" + _NOT_INVOKED),
    ("add", "read"): Message("future-read", "read found entry {e}" + _NOT_INVOKED),
    ("add", "lac"): Message("future-read", "read_lac returned {e}" + _NOT_INVOKED),
    ("add", "close"): Message("future-read", "{f} returned last entry {e}" + _NOT_INVOKED),
    ("missing", "add"): Message("stale-read", _NO_SUCH + "entry {e} was acknowledged"),
    ("missing", "read"): Message("stale-read", _NO_SUCH + "entry {e} was read"),
    ("missing", "lac"): Message("stale-read", _NO_SUCH + "LAC {e} was read"),
    ("missing", "close"): Message("stale-read", _NO_SUCH + "{f} returned {e}"),
}

# ---------------------------------------------------------------- the durability check
# Fields: ``e`` the entry, ``last`` the last entry the ledger's last recovery
# fixed, ``data`` the acknowledged payload, ``read`` and ``other`` payloads read.

LOST_UNREAD: Final = Message(
    "lost-write", "entry {e} was acknowledged but a final read found no such entry"
)
READ_BACK_OTHER_DATA: Final = Message(
    "divergent-read", "entry {e} was acknowledged as {data!r} but read back as {read!r}"
)
READ_BACK_BEYOND_RECOVERY: Final = Message(
    "read-of-truncated-entry", "entry {e} was read after recovery closed the ledger at {last}"
)
READ_BACK_TWICE: Final = Message(
    "divergent-read", "entry {e} was read back as {read!r} and as {other!r}"
)

# ---------------------------------------------------------------- the replication audit
# Fields: ``e`` the entry, ``bookie`` the bookie that lacks it, ``copies`` the
# replicas as ``bookie=digest`` joined by ", " in digest order.

NOT_ON_WRITE_SET: Final = Message(
    "under-replicated",
    "entry {e} of closed ledger {ledger} is not on bookie {bookie} of its write set",
)
REPLICAS_DIFFER: Final = Message(
    "digest-mismatch", "entry {e} of ledger {ledger} has replicas with different digests: {copies}"
)

# ---------------------------------------------------------------- a campaign's convergence
# Fields: ``ledger``, ``bookies`` the bookies missing replicas (joined by ", "),
# ``seconds`` the convergence phase's length.

MISSING_AFTER_CONVERGENCE: Final = Message(
    "under-replicated",
    "ledger {ledger} (Wq = Aq): after the cluster converged the full replica check found "
    "replicas missing on {bookies}",
)
NOT_CONVERGED: Final = Message(
    "not-repaired-after-heal", "the cluster did not converge within {seconds} s"
)

# ---------------------------------------------------------------- a campaign's traces
# Fields: ``event`` the step (node, number, action, arguments), ``reason`` why the spec
# does not allow it there.

TRACE_STEP_NOT_ALLOWED: Final = Message(
    "trace-violation", "no behaviour of the spec explains {event}: {reason}"
)

# ---------------------------------------------------------------- the generic search on Spark

NO_LINEARIZATION: Final = Message(
    "nonlinearizable",
    "key {key}: {blocked} cannot take effect after the longest linearizable prefix",
)
# The unique-writes engine (linearizability.unique) proves it: ``reason`` names the
# operations and what each shows.
NO_LINEARIZATION_PROOF: Final = Message("nonlinearizable", "key {key}: {reason}")
