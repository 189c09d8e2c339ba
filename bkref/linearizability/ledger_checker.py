"""The ledger checker: linearizability of ledger histories without search.

It decides exactly what the generic checker decides with ``bkref.spec.ledger_model``
(a property test holds the two together), in O(n log n) time and O(n) memory,
and names each violation with the operations that prove it.

Semantics (``bkref.spec.ledger_model`` states them as a sequential model):

- Per ledger: ``create`` (if the history has one) comes first; entries become
  visible as a prefix 0..n-1, an add taking effect only as the next entry id;
  ``read(e)`` finds ``e`` with its data iff it is added, and reports "no such
  entry" iff it is not; ``read_lac`` returns a LAC that never exceeds the added
  entries (a lower bound: it may go back across readers and lag the last entry
  after close, as BookKeeper's readLastAddConfirmed does, but never exceeds the
  closed last entry); ``close`` and ``recover`` close the ledger at the last
  added entry, after which no add takes effect.
- ``fail`` means the operation did not happen, except an add that failed as
  fenced: recovery may still have kept it, so it counts as unknown. Unknown
  operations (``info``, never completed) may take effect after their
  invocation or never. Real-time order is history index order.

Why no search is needed. An operation takes effect at a point strictly inside
(invocation index, completion index); unknown ones have no upper end. Because
entry ids fix the order of adds, every ordering constraint is known in advance:

- the adds of the entries that exist, 0..N-1, in id order (N = closed last
  entry + 1, or else one past the largest entry any ok add, found read or LAC
  proves; adding more could only add constraints);
- a found read of ``e`` after add ``e``; a "no such entry" read of ``e < N``
  before add ``e``; a LAC ``v`` after add ``v`` (LAC reads change nothing, so
  they constrain nothing else); a close after add ``N-1``; everything after
  the create.

These constraints form a DAG; points exist iff for every operation, the
largest invocation index among all operations that must precede it,
transitively (itself included), is smaller than its completion index. Along
the chain of adds that is a running maximum over entry ids; the rest (reads,
LAC reads, closes) are single comparisons against that chain. Among several
candidate adds for one entry id, an ok one must be used (two ok ones are a
duplicate) and otherwise the earliest-invoked one whose data matches what
reads found dominates the others.

Every violated comparison is reported as an anomaly, in Jepsen's names where
they fit, each with the invocation indices of the operations that prove it:

- ``lost-write``: an acknowledged entry beyond the last entry of a close or
  recovery; ``ack-after-fence``: an add sent after a close or recovery had
  completed, yet acknowledged;
- ``divergent-read``: an entry read with data its add did not write, or read
  with two different data;
- ``read-of-truncated-entry``: an entry (or LAC) read beyond the last entry a
  close or recovery fixed, before or after it;
- ``stale-read``: "no such entry" for an entry known to exist before the read
  began (acknowledged, read, within a LAC or a close). A LAC below one read
  before, or below the last entry of a close, is not stale: LAC reads are a
  lower bound;
- ``future-read``: an entry, LAC or last entry returned before the add it
  depends on was even invoked, or before the ledger's create; an entry read
  that no add ever wrote;
- ``duplicate``: two acknowledged adds of one entry id, or two creates
  returning one ledger id;
- ``nonmonotonic``: an add was acknowledged before the add of a smaller entry
  id was sent;
- ``disagreeing-closes``: two closes or recoveries with different last entries;
- ``skip``: an entry id below a proven one that no add ever wrote.

The history is linearizable iff there is none. The kinds and the words of
each message are :mod:`bkref.linearizability.anomalies`' (the Spark job renders the
same templates).
"""

from __future__ import annotations

import gc
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from bkref.linearizability import anomalies as msg
from bkref.linearizability.history import NEMESIS, HistoryError, Op
from bkref.linearizability.models import to_ledger_op

INF: Final = math.inf
MAX_EXAMPLES: Final = 50  # anomalies kept per kind and ledger; the rest are counted


class Anomaly(NamedTuple):
    """A violation and the operations (invocation indices) that prove it."""

    kind: str
    ledger: int
    ops: tuple[int, ...]
    message: str

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "ledger": self.ledger,
            "ops": list(self.ops),
            "message": self.message,
        }


@dataclass
class LedgerVerdict:
    ledger: int
    operations: int  # operations that took part (certain failures excluded)
    entries: int  # N: entries the ledger holds in the linearization
    closed_at: int | None  # the last entry if closed
    anomalies: list[Anomaly] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)  # all anomalies, by kind

    @property
    def valid(self) -> bool:
        return not self.counts


@dataclass
class LedgerCheckResult:
    ledgers: dict[int, LedgerVerdict]
    ops: int  # history lines read (ops, in Jepsen's sense)
    seconds: float

    @property
    def valid(self) -> bool:
        return all(v.valid for v in self.ledgers.values())

    @property
    def verdict(self) -> str:
        return "valid" if self.valid else "invalid"

    @property
    def anomalies(self) -> list[Anomaly]:
        return [a for v in self.ledgers.values() for a in v.anomalies]

    @property
    def counts(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for v in self.ledgers.values():
            total.update(v.counts)
        return total


# One operation of a ledger, compactly: (invocation index, completion index or INF, ...).
_Add = tuple[int, float, str]  # call, ret, data
_Read = tuple[int, int, float, str | None]  # entry, call, ret, data (None: not found)
_Lac = tuple[int, int, float]  # lac, call, ret
_Close = tuple[int, int, float, str]  # last entry, call, ret, f


class _Ledger:
    """What the checker keeps of one ledger: O(1) per operation."""

    __slots__ = ("adds", "closes", "creates", "extra_adds", "lacs", "n", "reads")

    def __init__(self) -> None:
        self.creates: list[tuple[int, float]] = []
        self.adds: dict[int, _Add] = {}  # the first add seen per entry id
        self.extra_adds: list[tuple[int, _Add]] = []  # more adds of an id already seen
        self.reads: list[_Read] = []
        self.lacs: list[_Lac] = []
        self.closes: list[_Close] = []
        self.n = 0


def _record(  # noqa: PLR0917 - called per operation: positional arguments are cheaper
    led: _Ledger, f: str, status: str, inp: object, out: object, call: int, ret: int
) -> None:
    r = to_ledger_op(f, status, inp, out, call)
    if r is None:
        return
    op, known = r
    end: float = ret if known else INF
    led.n += 1
    if op.f == "add":
        add = (call, end, op.data or "")
        if op.entry in led.adds:
            led.extra_adds.append((op.entry, add))
        else:
            led.adds[op.entry] = add
    elif not known:
        if op.f == "create":
            led.creates.append((call, INF))
        # an unknown read, LAC read or close constrains nothing: it may never happen
    elif op.f == "read":
        led.reads.append((op.entry, call, end, op.data if op.found else None))
    elif op.f == "read_lac":
        assert op.result is not None
        led.lacs.append((op.result, call, end))
    elif op.f == "create":
        led.creates.append((call, end))
    else:
        assert op.result is not None
        led.closes.append((op.result, call, end, op.f))


def _fast_ok(  # noqa: PLR0917 - called per operation: positional arguments are cheaper
    led: _Ledger, f: str, inp: object, out: object, call: int, ret: int
) -> bool:
    """Record a well-formed ok add, read or LAC read without the general
    translation (most of a big history); False leaves it to ``_record``, which
    accepts the same values and words the errors."""
    if f == "add":
        if type(inp) is dict:
            e, data = inp.get("entry"), inp.get("data")
            if type(e) is int and e >= 0 and type(data) is str:
                led.n += 1
                if e in led.adds:
                    led.extra_adds.append((e, (call, ret, data)))
                else:
                    led.adds[e] = (call, ret, data)
                return True
    elif f == "read":
        if type(inp) is dict and type(out) is dict:
            e, found = inp.get("entry"), out.get("found")
            if type(e) is int and e >= 0:
                if found is False:
                    led.n += 1
                    led.reads.append((e, call, ret, None))
                    return True
                data = out.get("data")
                if found is True and type(data) is str:
                    led.n += 1
                    led.reads.append((e, call, ret, data))
                    return True
    elif f == "read_lac" and type(out) is dict:
        lac = out.get("lac")
        if type(lac) is int and lac >= -1:
            led.n += 1
            led.lacs.append((lac, call, ret))
            return True
    return False


def check_ledgers(
    ops: Iterable[Op], *, progress: Callable[[int], None] | None = None
) -> LedgerCheckResult:
    """Check every ledger of a history (a stream of ops, validated or not)."""
    # Millions of small acyclic tuples: the cyclic collector would only scan
    # the growing heap again and again (about 15% of the time at 10^6 ops).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _check_ledgers(ops, progress)
    finally:
        if was_enabled:
            gc.enable()


def _check_ledgers(ops: Iterable[Op], progress: Callable[[int], None] | None) -> LedgerCheckResult:
    started = time.monotonic()
    ledgers: dict[int, _Ledger] = {}
    pending: dict[object, Op] = {}
    count = 0
    for op in ops:
        count += 1
        if progress is not None and count % 100_000 == 0:
            progress(count)
        p = op.process
        if p == NEMESIS:
            continue
        if op.type == "invoke":
            pending[p] = op
            continue
        inv = pending.pop(p, None)
        if inv is None:
            raise HistoryError(f"index {op.index}: completion without invocation on process {p}")
        ledger = op.ledger if op.ledger is not None else inv.ledger
        if ledger is None:
            if inv.f == "create":
                continue
            raise HistoryError(f"index {inv.index}: {inv.f!r} names no ledger")
        led = ledgers.get(ledger)
        if led is None:
            led = ledgers[ledger] = _Ledger()
        f = inv.f
        if op.type == "ok" and _fast_ok(led, f, inv.value, op.value, inv.index, op.index):
            continue
        _record(led, f, op.type, inv.value, op.value, inv.index, op.index)
    for inv in pending.values():  # never completed: the outcome is unknown
        if inv.ledger is not None:
            led = ledgers.get(inv.ledger)
            if led is None:
                led = ledgers[inv.ledger] = _Ledger()
            _record(led, inv.f, "info", inv.value, None, inv.index, -1)
    verdicts = {lid: _decide(lid, led) for lid, led in sorted(ledgers.items())}
    return LedgerCheckResult(verdicts, count, time.monotonic() - started)


# ---------------------------------------------------------------- the decision


class _Reporter:
    def __init__(self, verdict: LedgerVerdict) -> None:
        self.v = verdict

    def wants(self, kind: str) -> bool:
        return self.v.counts[kind] < MAX_EXAMPLES

    def __call__(self, message: msg.Message, ops: Iterable[int], **fields: object) -> None:
        """Count an anomaly; keep it, its message rendered, while its kind has room."""
        kind = message.kind
        self.v.counts[kind] += 1
        if self.v.counts[kind] <= MAX_EXAMPLES:
            text = message.render(**fields)
            self.v.anomalies.append(Anomaly(kind, self.v.ledger, tuple(ops), text))


def _decide(ledger: int, led: _Ledger) -> LedgerVerdict:
    closes = sorted(led.closes, key=lambda c: c[2])  # by completion: the first close is the witness
    closed_at = closes[0][0] if closes else None
    verdict = LedgerVerdict(ledger, led.n, 0, closed_at)
    bad = _Reporter(verdict)
    names = _Names(led)

    # The create: everything else takes effect after it.
    floor = -1
    ok_creates = [c for c in led.creates if c[1] != INF]
    if len(ok_creates) > 1:
        bad(msg.DUPLICATE_CREATES, [c for c, _ in ok_creates], n=len(ok_creates), ledger=ledger)
    if led.creates:
        floor = min(c for c, _ in (ok_creates or led.creates))

    for last, call, _, f in closes[1:]:
        if last != closed_at:
            first = closes[0]
            bad(
                msg.DISAGREEING_CLOSES,
                [first[1], call],
                first_f=first[3],
                first_last=closed_at,
                f=f,
                last=last,
            )

    # Adds: one candidate per entry id.
    ok_adds: dict[int, _Add] = {e: a for e, a in led.adds.items() if a[1] != INF}
    optional: dict[int, list[_Add]] = {}
    for e, a in led.adds.items():
        if a[1] == INF:
            optional.setdefault(e, []).append(a)
    for e, a in led.extra_adds:
        if a[1] == INF:
            optional.setdefault(e, []).append(a)
        elif e in ok_adds:
            bad(msg.DUPLICATE_ADDS, [ok_adds[e][0], a[0]], e=e)
        else:
            ok_adds[e] = a

    # What reads found, per entry.
    found: dict[int, tuple[str, int]] = {}  # entry -> (data, the first read that found it)
    missing_call: dict[int, int] = {}  # entry -> latest invocation of a "no such entry" read of it
    for e, call, _, data in led.reads:
        if data is None:
            if call > missing_call.get(e, -1):
                missing_call[e] = call
        elif e not in found:
            found[e] = (data, call)
        elif found[e][0] != data:
            bad(msg.DIVERGENT_READS, [found[e][1], call], e=e, read=found[e][0], other=data)

    # N: the entries that exist.
    proven, proven_op = -1, -1
    for e, a in ok_adds.items():
        if e > proven:
            proven, proven_op = e, a[0]
    for e, (_, call) in found.items():
        if e > proven:
            proven, proven_op = e, call
    for v, call, _ in led.lacs:
        if v > proven:
            proven, proven_op = v, call
    if closed_at is not None:
        n = closed_at + 1
        close_op, close_ret = closes[0][1], closes[0][2]
        at = {"f": closes[0][3], "closed_at": closed_at}  # the message's close
        for e, a in ok_adds.items():
            if e >= n:
                if a[0] > close_ret:
                    bad(msg.ACK_AFTER_FENCE, [a[0], close_op], **at, e=e)
                else:
                    bad(msg.LOST_BEYOND_CLOSE, [a[0], close_op], **at, e=e)
        for e, (_, call) in found.items():
            if e >= n:
                bad(msg.READ_BEYOND_CLOSE, [call, close_op], **at, e=e)
        for v, call, _ in led.lacs:
            if v >= n:
                bad(msg.LAC_BEYOND_CLOSE, [call, close_op], **at, e=v)
        requirer = close_op
    else:
        n = proven + 1
        requirer = proven_op
    if n > 2 * led.n + 16:
        # An entry id far beyond anything written (a corrupt close or LAC): do
        # not walk a chain that long; the gap below it already decides.
        gap = 0
        while gap in led.adds:
            gap += 1
        bad(msg.SKIPPED_RANGE, [requirer], first=gap, last=n - 1)
        n = gap
    verdict.entries = n

    # The chain of adds 0..N-1. Each add takes effect after every add of a
    # smaller entry and every "no such entry" read of an entry <= its own, so
    # the lower bound of its point is a running maximum of their invocation
    # indices. An operation is named by its invocation index, so the bound is
    # also the operation that causes it. Adds and reads are kept apart to
    # name the anomaly by its cause.
    mx_add = [0] * n
    mx_miss = [0] * n
    best_add = best_miss = -1
    for e in range(n):
        add = ok_adds.get(e)
        if add is None:
            cands = optional.get(e, [])
            if e in found:
                cands = [a for a in cands if a[2] == found[e][0]]
            if cands:
                add = min(cands)
            elif optional.get(e):
                bad(
                    msg.READ_UNWRITTEN_DATA,
                    [found[e][1], min(optional[e])[0]],
                    e=e,
                    read=found[e][0],
                )
            elif e in found:
                bad(msg.READ_NEVER_WRITTEN, [found[e][1]], e=e)
            else:
                bad(msg.SKIPPED, [requirer], e=e)
        elif e in found and found[e][0] != add[2]:
            bad(msg.READ_OTHER_DATA, [add[0], found[e][1]], e=e, data=add[2], read=found[e][0])
        if add is not None and add[0] > best_add:
            best_add = add[0]
        best_miss = max(best_miss, missing_call.get(e, -1))
        mx_add[e], mx_miss[e] = best_add, best_miss
        if add is not None and add[1] <= max(floor, best_add, best_miss):
            for cause, kind in ((floor, "create"), (best_add, "add"), (best_miss, "missing")):
                if add[1] <= cause:
                    _too_early(bad, kind, cause, "add", add[0], e=e, names=names)

    def causes(e: int) -> tuple[tuple[int, str], ...]:
        """What must precede an operation that comes after add ``e``."""
        if e < 0:
            return ((floor, "create"),)
        return ((floor, "create"), (mx_add[e], "add"), (mx_miss[e], "missing"))

    def check(
        victim: str,
        call: int,
        ret: float,
        e: int,
        *,
        f: str = "close",
    ) -> None:
        for cause, kind in causes(e):
            if ret <= cause:
                _too_early(bad, kind, cause, victim, call, e=e, f=f, names=names)

    for e, call, ret, data in led.reads:
        if data is None:
            if ret <= floor:
                _too_early(bad, "create", floor, "read", call, e=e)
        elif e < n:
            check("read", call, ret, e)

    # LAC reads: after add v only. A LAC is a lower bound, not a register: it
    # may go back across readers and lag a close (values above the closed last
    # entry were reported above as truncated).
    for v, call, ret in led.lacs:
        if v < n:
            check("lac", call, ret, v)

    # Closes: after add N-1.
    for last, call, ret, f in closes:
        if last == closed_at:
            check("close", call, ret, n - 1, f=f)
    return verdict


class _Names:
    """The entry id (or LAC) each invocation names, for messages; built on first use."""

    def __init__(self, led: _Ledger) -> None:
        self.led = led
        self.by_call: dict[int, int] | None = None

    def __call__(self, call: int) -> int:
        if self.by_call is None:
            led = self.led
            names = {a[0]: e for e, a in led.adds.items()}
            names.update((a[0], e) for e, a in led.extra_adds)
            names.update((r[1], r[0]) for r in led.reads)
            names.update((lac[1], lac[0]) for lac in led.lacs)
            self.by_call = names
        return self.by_call.get(call, -1)


def _too_early(
    bad: _Reporter,
    cause: str,
    cause_op: int,
    victim: str,
    victim_op: int,
    *,
    e: int,
    f: str = "close",
    names: _Names | None = None,
) -> None:
    message = msg.TOO_EARLY[(cause, victim)]
    # the cause's entry only for a message that is kept: naming builds an index
    c = names(cause_op) if names is not None and bad.wants(message.kind) else -1
    bad(message, [cause_op, victim_op], e=e, c=c, f=f)
