"""Bounds of a model-checking run (the config object) and the protocol mutants.

A config fixes the cluster (bookies, E/Wq/Aq), the ledgers and what the
environment may do (crashes, message losses and duplicates, autorecovery
disables, auditor elections). Every budget is finite, so every run ends.

A mutant re-creates one known BookKeeper bug as a switch; the spec's action
functions consult ``config.mutants``. The correct spec has no mutant on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# Mutant names and the bug each re-creates (printed by `bkref spec list`).
MUTANTS: dict[str, str] = {
    "recovery-reads-without-fence": (
        "recovery reads do not fence, so an unfenced bookie still accepts the old "
        "writer's add after the recovery client decided the entry is absent (BOOKKEEPER-2614)"
    ),
    "recovery-from-lac-minus-one": (
        "recovery starts at LAC + 1 even when LAC is -1 in a ledger of several segments, "
        "and changes the ensemble from there, writing an earlier first entry (BOOKKEEPER-2615)"
    ),
    "recovery-reads-from-new-ensemble": (
        "recovery reads, and counts negatives, in the ensemble its own write-back "
        "changed: a replacement that never had the entry answers NoSuchEntry and the "
        "ledger is closed before an acknowledged entry (BOOKKEEPER-581)"
    ),
    "acks-before-ensemble-change-lands": (
        "the writer sends pending entries to the new ensemble and confirms those it "
        "acknowledges before the ensemble-change metadata write lands (BOOKKEEPER-1591)"
    ),
    "acks-from-replaced-bookie-count": (
        "the writer counts acks by write-set index, so the replaced bookie's acks still "
        "count until after the ensemble change lands, when the held completions are "
        "released before those acks are unset: an entry is confirmed on a bookie the new "
        "metadata no longer names, and never resent to its replacement (apache/bookkeeper"
        "#4651, unfixed)"
    ),
    "recovery-piggybacks-its-own-lac": (
        "a recovery's write-back carries the recovery's own LAC, which grows as its earlier "
        "write-backs reach ack quorum (BookKeeper's PendingAddOp.initiate signs a recovery add "
        "with the handle's lastAddConfirmed): with two recoveries racing, one closes the "
        "ledger before an entry the other's write-back declared confirmed, and a tailing "
        "reader returns it (docs/findings/two-recoveries.md; unreported upstream)"
    ),
    "negative-read-without-coverage": (
        "one NoSuchEntry recovery read is taken as final, without quorum coverage "
        "(Wq - Aq + 1 negatives of the write set)"
    ),
    "repair-open-segment-without-fence": (
        "a replication worker copies the open last segment and swaps the lost bookie "
        "without fencing the ledger first (the open-ledger data loss of the 2012 design)"
    ),
    "delete-task-without-version-check": (
        "the worker deletes the under-replication task without a version check while "
        "the auditor records a new loss in it"
    ),
    "ack-before-fsync": (
        "a bookie acknowledges an add before its journal is synced, then crashes and "
        "loses the unsynced entry"
    ),
    "fence-lost-on-restart": (
        "a bookie keeps a ledger's fence only in memory: restarted after a crash with all "
        "its entries, it takes the old writer's adds again after recovery closed the "
        "ledger (BOOKKEEPER-500)"
    ),
    "wiped-bookie-rejoins": (
        "a bookie restarted with a wiped disk rejoins under the same identity, "
        "forgetting entries and fences (no cookie check, BOOKKEEPER-2612)"
    ),
    "open-segment-without-entries-skipped": (
        "the replication worker finds a lost bookie of an open ledger's last segment "
        "only through entries it can read there, so a lost bookie that got none yet is "
        "missed and the task dropped; the ledger is closed naming it (BOOKKEEPER-742)"
    ),
    "ensemble-change-undoes-swap": (
        "the writer's ensemble change, retried after a version conflict with a replication "
        "worker's swap of an earlier segment, writes its own stale view of the earlier "
        "segments: the lost bookie is back in the segment the worker repaired "
        "(BOOKKEEPER-667, fixed by merging every ensemble but the last from the store)"
    ),
    "recovery-close-undoes-swap": (
        "a recovery's close, retried after a version conflict with a replication worker's "
        "swap of an earlier segment, writes its own stale view of the segments: the lost "
        "bookie is back in the segment the worker repaired (BOOKKEEPER-584, fixed by "
        "taking the stored ensembles on close)"
    ),
    "worker-skips-ledger-lock": (
        "a replication worker takes a ledger without checking that another worker "
        "holds its lock, so two workers repair the same ledger at once"
    ),
    "release-deletes-any-lock": (
        "a replication worker that lost its ledger's lock (its ZooKeeper session expired) "
        "deletes the lock znode at any version when it lets the ledger go, dropping the "
        "lock the next worker holds, as BookKeeper's releaseUnderreplicatedLedger does"
    ),
    "auditor-without-election": (
        "a node starts auditing without winning the election (it does not create the "
        "leader znode), beside the elected auditor"
    ),
    "auditor-acts-after-session-loss": (
        "the auditor keeps auditing after its ZooKeeper session expired, while "
        "another node wins the next election"
    ),
    "audit-marks-only-its-earlier-scan": (
        "an audit whose read of a ledger came before a worker's swap marks from that read "
        "alone and counts as the audit of every loss before its marks: a bookie the swap "
        "brought in and that went down in between is never marked (the model checker's "
        "find in a draft of the spec's step for such marks)"
    ),
}


@dataclass(frozen=True)
class Config:
    """The bounds of one model-checking run.

    Ledgers ``0 .. closed_ledgers-1`` start CLOSED with ``closed_entries``
    entries on every bookie of their write sets (ensemble = the first E bookies);
    the last ledger, if ``writer``, belongs to the writer and starts uncreated,
    or OPEN and empty when ``writer_ledger_created``.
    """

    name: str
    description: str
    bookies: int = 4
    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    entries: int = 2  # entries the writer may add to its ledger
    pipeline: int = 1  # adds the writer may have unconfirmed at once
    writer: bool = True
    writer_ledger_created: bool = False
    # The writer's ledger starts with two segments: e0 confirmed on the first
    # E bookies, then the last of them replaced by the next bookie from e1 on.
    two_segments: bool = False
    # With writer_ledger_created: e0 is already on its write set and confirmed.
    first_entry_confirmed: bool = False
    # The writer may close its ledger (False: a long-lived writer that only stops when fenced,
    # which keeps it adding, and its ensemble changes racing, in every behaviour).
    writer_closes: bool = True
    recovery_client: bool = True  # a client may open the writer's ledger with recovery
    # Recovery clients of the writer's ledger, racing each other (with recovery_client, or
    # when a worker asks for recovery: AutoRecovery configs have one).
    recovery_clients: int = 1
    # Readers of the writer's ledger, opened without recovery (tailing readers): what they
    # return to the application is checked against the ledger's final close.
    readers: int = 0
    closed_ledgers: int = 0
    closed_entries: int = 1
    losses: int = 0  # messages the network may drop
    reply_losses: bool = False  # a loss may also hit an add's reply (stored, but unheard)
    duplicates: int = 0  # messages the network may duplicate
    crashes: int = 0  # bookie crashes
    restarts: bool = True  # a crashed bookie may restart with its synced data
    wipes: int = 0  # restarts with a wiped disk
    autorecovery: bool = False  # auditor and replication workers
    workers: int = 1
    # The auditor's periodic ledger check: it marks live bookies that miss entries.
    periodic_check: bool = False
    elections: int = 0  # auditor session losses (each followed by a new election)
    toggles: int = 0  # times the operator may disable autorecovery (re-enabling is fair)
    # Recovery attempts that may fail on error answers from bookies that are down (the client
    # then starts again: ``protocol.recovery_client_gives_up``).
    give_ups: int = 0
    # Repair attempts a worker may abandon because a copy failed (a bookie that does not
    # answer, a busy repair slot: ``protocol.worker_fails_repair``).
    repair_failures: int = 0
    # ZooKeeper sessions of running bookies that may expire (``protocol.bookie_loses_session``):
    # the bookie serves on, unregistered, until it registers again.
    session_losses: int = 0
    # Locks of replication workers that ZooKeeper may drop (``protocol.worker_loses_lock``):
    # the worker's session expired or its process died, and another may take the ledger.
    lock_losses: int = 0
    mutants: frozenset[str] = field(default_factory=frozenset)
    # Invariants that do not hold under this config's faults (e.g. Aq replicas
    # once disks may be wiped); the checker skips them and says so.
    skip_invariants: frozenset[str] = field(default_factory=frozenset)
    liveness: str = ""  # name of the goal checked under weak fairness, "" for none
    # Drop requests whose delivery can change nothing (``protocol.dead_request``):
    # a bisimulation quotient, on by default; off only to test that it is sound.
    reduce_dead_requests: bool = True
    # False when replaying a recorded trace (bkref.tracecheck): one behaviour is followed,
    # not a state space explored, so the explicit-state bounds below do not apply.
    bounded: bool = field(default=True, compare=False)
    # Derived, stored rather than computed: actions read them on every step.
    ledgers: int = field(init=False, repr=False, compare=False)
    writer_ledger: int = field(init=False, repr=False, compare=False)  # the last ledger's index

    def __post_init__(self) -> None:
        ledgers = self.closed_ledgers + (1 if self.writer else 0)
        object.__setattr__(self, "ledgers", ledgers)
        object.__setattr__(self, "writer_ledger", ledgers - 1)
        if not self.bookies >= self.ensemble >= self.write_quorum >= self.ack_quorum >= 1:
            raise ValueError("need bookies >= E >= Wq >= Aq >= 1")
        if self.recovery_clients < 1:
            raise ValueError("need recovery_clients >= 1")
        if self.bounded and (self.bookies > 8 or self.entries > 6):
            raise ValueError("bounds too large for explicit-state checking")
        unknown = sorted(m for m in self.mutants if m not in MUTANTS)
        if unknown:
            raise ValueError(f"unknown mutants: {unknown}")

    def with_mutant(self, mutant: str) -> Config:
        return replace(self, mutants=self.mutants | {mutant})

    def bounds(self) -> str:
        """One line saying what the config bounds."""
        parts = [
            f"{self.bookies} bookies",
            f"E={self.ensemble} Wq={self.write_quorum} Aq={self.ack_quorum}",
        ]
        if self.writer:
            parts.append(f"writer with {self.entries} entries")
            if self.recovery_client:
                n = self.recovery_clients
                parts.append("a recovery client" if n == 1 else f"{n} recovery clients")
        if self.writer and self.readers:
            parts.append("a reader" if self.readers == 1 else f"{self.readers} readers")
        if self.writer and self.pipeline > 1:
            parts.append(f"{self.pipeline} adds in flight")
        if self.writer and not self.writer_closes:
            parts.append("the writer never closes")
        if self.writer and self.first_entry_confirmed:
            parts.append("e0 already confirmed")
        if self.two_segments:
            parts.append("writer's ledger starts with two segments")
        if self.closed_ledgers:
            parts.append(f"{self.closed_ledgers} closed ledger(s) of {self.closed_entries} entries")
        for n, what in (
            (self.losses, "message loss(es)"),
            (self.duplicates, "duplicate(s)"),
            (self.crashes, "bookie crash(es)"),
            (self.wipes, "wiped-disk restart(s)"),
            (self.elections, "auditor session loss(es)"),
            (self.toggles, "autorecovery disable(s)"),
            (self.give_ups, "recovery give-up(s)"),
            (self.repair_failures, "failed repair(s)"),
            (self.session_losses, "bookie session loss(es)"),
            (self.lock_losses, "worker lock loss(es)"),
        ):
            if n:
                parts.append(f"{n} {what}")
        if self.crashes and not self.restarts:
            parts.append("no restarts")
        if self.autorecovery:
            parts.append(f"auditor and {self.workers} worker(s)")
        if self.periodic_check:
            parts.append("periodic ledger check")
        if self.liveness:
            parts.append(f"liveness: {self.liveness}")
        if not self.reduce_dead_requests:
            parts.append("no dead-request reduction")
        return ", ".join(parts)
