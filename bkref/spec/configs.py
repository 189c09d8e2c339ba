"""Named configs: the bounds each exhaustive check runs under, and the mutants' configs.

``CONFIGS`` holds the three full configs of the issue (``a``, ``b``, ``c``),
their short versions for ``make verify`` (``*-short``) and small configs
for liveness. ``MUTANT_CONFIGS`` names, per mutant, the config that
re-creates its bug (``bkref spec check --mutant M`` uses it).
"""

from __future__ import annotations

from dataclasses import replace

from bkref.spec.config import MUTANTS, Config

_A = Config(
    name="a",
    description="one ledger: writer and recovery client, one message loss",
    bookies=4,
    ensemble=3,
    write_quorum=3,
    ack_quorum=2,
    # 850,757 distinct states, 109 s instrumented in make spec-check on 2026-11-28
    # (1,040,171 before write-backs carried LC, not recovery's own LAC; 1,110,060 before
    # the writer re-sent only once its CAS landed; 1,420,437 before a recovery's resend kept
    # the LAC of its first send; 1,371,783 before recovery read LC first; 918,134 before
    # the writer ignored fenced answers that no longer concern it, took a recovery's close
    # at its own LAC as its own, and could resend after the CAS).
    entries=2,
    losses=1,
)
_B = Config(
    name="b",
    description="striping E=4 > Wq=3 with an ensemble change after a bookie crash",
    bookies=5,
    ensemble=4,
    write_quorum=3,
    ack_quorum=2,
    # 1,089,786 distinct states, 131 s instrumented in make spec-check on 2026-11-28
    # (1,295,121 before write-backs carried LC; 1,954,765 before the writer re-sent only
    # once its CAS landed; 2,395,920 before a recovery's resend kept the LAC of its first
    # send; 2,369,273 before recovery read LC first; 1,719,280 before the writer's answers
    # and close followed BookKeeper).
    entries=2,
    crashes=1,
    restarts=False,
)
_C = Config(
    name="c",
    description="AutoRecovery: a closed and an open ledger, one bookie crash, auditor and a worker",
    bookies=4,
    ensemble=3,
    write_quorum=3,
    ack_quorum=2,
    entries=1,
    writer_ledger_created=True,
    # With e0 still to add: over 630k states at depth 21 after 8 min (reduced), unfinished.
    first_entry_confirmed=True,
    recovery_client=False,
    closed_ledgers=1,
    closed_entries=1,
    crashes=1,
    autorecovery=True,
    workers=1,
)

# AutoRecovery on the writer's open ledger, whose first segment is closed: the worker's swap
# there races the writer's ensemble change and an application's recovery, which must merge it.
_MERGE = replace(
    _C,
    name="c-merge",
    ensemble=2,
    write_quorum=2,
    ack_quorum=2,
    entries=2,
    two_segments=True,
    recovery_client=True,
    closed_ledgers=0,
    restarts=False,
    repair_failures=1,
    description="AutoRecovery on the writer's open ledger of two segments, one crash "
    "without restart, an application's recovery beside the worker: the worker's swap of "
    "the closed first segment races the writer's ensemble change and the recovery's "
    "close, each of which must keep the swap; a repair may fail and be taken again",
)

# Two recoveries over pipelined adds and a tailing reader (docs/findings/two-recoveries.md):
# 316,346 states, 42 s, on 2026-11-28.
_READERS = Config(
    name="a-readers",
    description="two recovery clients racing over two adds in flight, and a reader that "
    "opens the ledger without recovery, polls the bookies' LAC, reads up to it and sees "
    "the close: with E=Wq=Aq=2 one NoSuchEntry lets one client close the ledger before "
    "entries the other writes back; no reader may return an entry the close excludes",
    bookies=2,
    ensemble=2,
    write_quorum=2,
    ack_quorum=2,
    entries=2,
    pipeline=2,
    writer_ledger_created=True,
    writer_closes=False,
    recovery_clients=2,
    readers=1,
)

CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        _A,
        _B,
        _C,
        replace(
            _A,
            name="a-short",
            entries=1,
            losses=0,
            liveness="ledger-closed",
            description="config a without the message loss (liveness: closed)",
        ),
        replace(
            _B,
            name="b-short",
            entries=1,
            crashes=0,
            description="config b without the crash",
        ),
        replace(
            _B,
            name="live-resend",
            entries=1,
            crashes=0,
            losses=1,
            ack_quorum=3,
            liveness="ledger-closed",
            # 23,108 states. Kills the mutation-testing survivor that resent a recovery's
            # add to the wrong bookies (docs/mutation.md): with Aq = Wq a write-back
            # needs its resend, and with E > Wq the new bookie's index is not fixed by
            # symmetry (in config a the resend reached the one spare by luck).
            description="liveness: a recovery whose write-back add is lost changes its "
            "ensemble and resends the entry, striping E=4 > Wq=Aq=3, and closes the ledger",
        ),
        replace(
            _C,
            name="c-short",
            writer=False,
            crashes=2,
            toggles=1,
            elections=1,
            description="config c with the closed ledger only, two crashes, an auditor "
            "session loss, autorecovery off and on",
        ),
        replace(
            _C,
            name="live-c",
            writer=False,
            crashes=1,
            toggles=1,
            elections=1,
            liveness="repaired",
            description="liveness: under-replication of a closed ledger is eventually "
            "repaired (one crash, an auditor session loss, autorecovery off and on)",
        ),
        replace(
            _A,
            name="a-reply",
            entries=1,
            reply_losses=True,
            description="config a with one entry; its message loss may hit an add's reply "
            "instead (stored by the bookie, never heard by the writer)",
        ),
        replace(
            _A,
            name="a-dup",
            entries=1,
            losses=0,
            duplicates=1,
            description="config a with a duplicated message instead of the loss",
        ),
        replace(
            _C,
            name="c-workers",
            writer=False,
            workers=2,
            crashes=2,
            toggles=1,
            elections=1,
            description="two workers racing for the closed ledger's lock and two auditor "
            "candidates in an election: two crashes, a session loss, autorecovery off and on",
        ),
        replace(
            _C,
            name="c-lock",
            bookies=5,
            writer=False,
            workers=2,
            repair_failures=1,
            lock_losses=1,
            # Five bookies: both workers' bookies are outside the ensemble, so both can copy
            # the lost fragment. 4,756 states (two crashes: 670,718).
            description="a worker's lock dropped by ZooKeeper (its session expired, its "
            "process died) while it repairs the closed ledger: the other worker takes the "
            "ledger beside it, both copy the lost bookie's fragment, the second swap is "
            "dropped, and the first one's release must leave the second one's lock; a "
            "failed repair",
        ),
        replace(
            _C,
            name="live-check",
            writer_ledger_created=True,
            first_entry_confirmed=False,
            closed_ledgers=0,
            crashes=0,
            periodic_check=True,
            toggles=1,
            elections=1,
            liveness="fully-replicated",
            description="liveness: the periodic check repairs a replica lost without a "
            "bookie loss (the writer closes before its third add lands), through an auditor "
            "session loss and autorecovery off and on",
        ),
        replace(
            _A,
            name="a-recoveries",
            entries=1,
            losses=0,
            recovery_clients=2,
            description="config a with one entry and two recovery clients racing: both "
            "fence and read, one closes, the other finds the ledger closed and reports the "
            "stored last entry (its own, or another)",
        ),
        replace(
            _C,
            name="c-race",
            bookies=3,
            ensemble=2,
            write_quorum=2,
            ack_quorum=2,
            first_entry_confirmed=False,
            closed_ledgers=0,
            crashes=2,
            restarts=False,
            # An application's recovery beside the worker's: its ensemble change can name a
            # bookie that crashes before the close lands (the recovery / auditor race with an
            # effect). 112,233 states (15,886 with the worker's recovery only).
            recovery_client=True,
            description="AutoRecovery meets the writer's open ledger, two crashes without "
            "restarts, an application's recovery beside the worker's: every pair of metadata "
            "writers races on the ledger; a new bookie crashes before the ensemble change or "
            "the close that names it lands (the periodic bookie check finds it); both copies "
            "of an entry are lost while a worker repairs it",
        ),
        _MERGE,
        replace(
            _MERGE,
            name="c-session",
            crashes=0,
            session_losses=1,
            repair_failures=0,
            description="a bookie cut off from ZooKeeper while it runs: its session expires, "
            "the auditor marks its ledgers and the worker moves its replica of the open "
            "ledger's closed segment, or asks for the ledger's recovery, while the writer's "
            "adds and the recovery's fencing still reach it; it registers again later",
        ),
        replace(
            _C,
            name="c-open-check",
            bookies=5,
            entries=2,
            first_entry_confirmed=False,
            closed_ledgers=0,
            crashes=0,
            losses=1,
            periodic_check=True,
            description="the periodic check of an open ledger: an add lost on its way to one "
            "bookie of the write set (E=Wq=3, Aq=2) is confirmed without it and the writer "
            "replaces that bookie after the LAC, so a closed segment of the open ledger misses "
            "the entry on a live bookie; the check marks it and the worker moves the replica "
            "while the writer goes on",
        ),
        replace(
            _C,
            name="c-check-crash",
            bookies=3,
            ensemble=2,
            write_quorum=2,
            ack_quorum=1,
            first_entry_confirmed=False,
            closed_ledgers=0,
            crashes=1,
            restarts=True,
            losses=1,
            periodic_check=True,
            description="a replica found missing an entry, then lost and back: the add to one "
            "bookie of the write set is lost (Aq=1) and the writer closes; the periodic check "
            "lists that bookie, which crashes and restarts without the entry. The worker "
            "checks the replicas its task lists and moves this one, as BookKeeper's worker "
            "re-checks the ledger instead of trusting the task",
        ),
        replace(
            _A,
            name="a-give-up",
            bookies=3,
            ensemble=2,
            write_quorum=2,
            ack_quorum=1,
            losses=0,
            crashes=1,
            give_ups=1,
            description="a recovery that gives up: with Wq=2 and Aq=1 one bookie down leaves "
            "fencing without coverage, or an entry with one NoSuchEntry, and the recovery "
            "fails (D18); its requests still in flight land unheard, the bookie restarts and "
            "the client recovers the ledger again, as it is (IN_RECOVERY)",
        ),
        _READERS,
    )
}

# Configs too big for `make verify` and `make spec-check`: `make spec-big` checks them with
# fingerprints (``bkref spec check --fingerprints``); BENCHMARKS.md has their time and memory.
BIG_CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        replace(
            _A,
            name="a3",
            entries=3,
            description="config a with three entries: the writer's pipeline, recovery and a "
            "message loss over a longer ledger",
        ),
        replace(
            _A,
            name="a-crash",
            crashes=1,
            description="config a with a bookie crash (and restart) besides the message loss",
        ),
        replace(
            _A,
            name="a-recoveries-loss",
            entries=1,
            recovery_clients=2,
            description="config a with one entry, two recovery clients racing and the "
            "message loss (a write-back lost: a recovery ensemble change)",
        ),
    )
}

_M = Config(
    name="m",
    description="a ledger with a writer and a recovery client, one entry",
    entries=1,
)

_TWO_WORKERS = replace(
    _C,
    name="m-two-workers",
    writer=False,
    workers=2,
    description="a closed ledger, one bookie crash, two workers (each an auditor candidate)",
)

_CRASH = replace(
    _M,
    name="m-journal",
    crashes=1,
    description="one entry, one bookie crash and restart",
)

_M581 = replace(
    _M,
    name="m-581",
    bookies=3,
    ensemble=2,
    write_quorum=2,
    ack_quorum=1,
    entries=2,
    pipeline=2,
    writer_ledger_created=True,
    losses=1,
    description="E=Wq=2, Aq=1: two entries, both adds in flight at once, one message "
    "loss (a write-back that forces a recovery ensemble change)",
)

# The config each mutant needs: small, so that the BFS finds the bug fast.
MUTANT_CONFIGS: dict[str, Config] = {
    "recovery-reads-without-fence": replace(
        _M,
        name="m-2614",
        losses=1,
        description="one entry, one message loss (a fence that never arrives)",
    ),
    "recovery-from-lac-minus-one": replace(
        _M,
        name="m-2615",
        ensemble=2,
        write_quorum=2,
        ack_quorum=2,
        losses=1,
        entries=2,
        two_segments=True,
        description="the writer's ledger has two segments (e0 confirmed, then an "
        "ensemble change), one message loss during recovery",
    ),
    "recovery-reads-from-new-ensemble": _M581,
    "acks-before-ensemble-change-lands": replace(
        _M,
        name="m-1591",
        losses=1,
        description="one entry, one message loss that forces an ensemble change",
    ),
    "acks-from-replaced-bookie-count": replace(
        _M581,
        name="m-4651",
        ack_quorum=2,
        recovery_client=False,
        description="E=Wq=Aq=2: two entries, both adds in flight at once, one message loss "
        "(an ensemble change while an add to the replaced bookie is still under way), "
        "no recovery",
    ),
    "recovery-piggybacks-its-own-lac": replace(
        _READERS,
        name="m-two-recoveries",
        # The stored LAC passes the last entry (NoDirtyReads) three steps before the reader
        # returns an entry: skipped here so that the shortest trace ends in the observation.
        skip_invariants=frozenset({"NoDirtyReads"}),
        description="config a-readers without NoDirtyReads: the shortest trace ends with "
        "the reader returning an entry the close excludes",
    ),
    "negative-read-without-coverage": replace(
        _M,
        name="m-coverage",
        description="one entry, no faults: slow adds are enough",
    ),
    "repair-open-segment-without-fence": replace(
        _C,
        name="m-open-segment",
        first_entry_confirmed=False,
        closed_ledgers=0,
        description="an open ledger, one bookie crash and restart, auditor and a worker",
    ),
    "delete-task-without-version-check": replace(
        _C,
        name="m-task-version",
        writer=False,
        crashes=2,
        description="a closed ledger, two bookie crashes, auditor and a worker",
    ),
    "ack-before-fsync": _CRASH,
    "fence-lost-on-restart": _CRASH,
    "wiped-bookie-rejoins": replace(
        _M,
        name="m-2612",
        crashes=1,
        wipes=1,
        skip_invariants=frozenset({"AllCommittedEntriesReachAckQuorum"}),
        description="one entry, one bookie crash and a restart on a wiped disk",
    ),
    "open-segment-without-entries-skipped": replace(
        _C,
        name="m-742",
        write_quorum=2,
        ack_quorum=2,
        closed_ledgers=0,
        description="an open ledger striped E=3 > Wq=2 with e0 confirmed (the third "
        "bookie holds nothing), one bookie crash, auditor and a worker",
    ),
    "ensemble-change-undoes-swap": replace(
        _MERGE,
        name="m-merge-writer",
        recovery_client=False,
        writer_closes=False,
        losses=1,
        repair_failures=0,
        description="config c-merge without the application's recovery and its failed "
        "repair, the writer never closing, and a message loss: the worker's swap of the "
        "closed first segment (a crash there) races the writer's ensemble change (an add "
        "lost in the last), as bkref's worker copies a closed segment only while the last "
        "one names no lost bookie",
    ),
    "recovery-close-undoes-swap": _MERGE,
    "worker-skips-ledger-lock": _TWO_WORKERS,
    "release-deletes-any-lock": replace(
        _TWO_WORKERS,
        name="m-lock-loss",
        lock_losses=1,
        description="a closed ledger, one bookie crash, two workers (each an auditor "
        "candidate), one worker's lock dropped by ZooKeeper",
    ),
    "auditor-without-election": _TWO_WORKERS,
    "audit-marks-only-its-earlier-scan": CONFIGS["c-short"],
    "auditor-acts-after-session-loss": replace(
        _TWO_WORKERS,
        name="m-auditor-session",
        elections=1,
        description="a closed ledger, one bookie crash, two worker nodes (auditor "
        "candidates), one auditor session loss",
    ),
}
assert MUTANT_CONFIGS.keys() == MUTANTS.keys()

# Every config by its name: the configs above, then the mutants' own (``m-*``), which
# run with the correct spec unless a mutant is switched on.
NAMED: dict[str, Config] = {**CONFIGS, **{c.name: c for c in MUTANT_CONFIGS.values()}}

# What `bkref spec check --config` accepts: the named configs and the big ones.
CHECKABLE: dict[str, Config] = {**NAMED, **BIG_CONFIGS}


def mutant_config(mutant: str) -> Config:
    """The config that re-creates ``mutant``'s bug, with the mutant switched on."""
    return MUTANT_CONFIGS[mutant].with_mutant(mutant)
