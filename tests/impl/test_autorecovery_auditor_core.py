"""The sans-I/O auditor core, driven event by event: no ZooKeeper, no bookies, no clock.

Each test feeds the events the auditor's shell would (election votes, registrations,
the ledgers it read, probe verdicts, the injected time) and asserts the decisions the
core takes as actions: audits, marks, ledger checks.
"""

from __future__ import annotations

import functools
import random

import pytest

from bkref.impl.bookie.config import BookieConfig
from bkref.impl.core.actions import LocalProtocolError
from bkref.impl.core.audit import (
    AuditorConfig,
    AuditorCore,
    AuditView,
    CheckLedgers,
    JoinElection,
    LedgerCheck,
    Mark,
    Probe,
    ReadDelay,
    ReadLedgers,
    Verdict,
    plan_marks,
)
from bkref.impl.core.metadata import Segment
from bkref.impl.core.planted import UnknownPlantError
from bkref.impl.core.repair import Reason
from tests.impl.core_helpers import A, B, C, D, E, ledger_md

_md = functools.partial(ledger_md, password=b"pw")
ALL = frozenset({A, B, C, D, E})


def _leader(config: AuditorConfig | None = None, now: int = 0) -> AuditorCore:
    """An auditor elected at ``now`` that has seen every bookie registered and done the
    audit of its election (which named A, B and C)."""
    core = AuditorCore("n1", config or AuditorConfig(), now)
    core.on_votes(None, None, now)
    assert core.take_actions() == [JoinElection("n1")]
    core.on_votes(5, 5, now)
    assert core.leading
    assert core.epoch == 5
    assert core.stale
    core.on_registered(ALL, now)
    core.tick(now)
    assert core.take_actions() == [ReadLedgers()]
    assert core.audit_due_at is None  # no longer stale: the audit is under way
    core.on_ledgers(AuditView(ALL, frozenset(), [(1, _md((Segment(0, (A, B, C)),)))]))
    assert core.take_actions() == []
    return core


def test_only_the_lowest_vote_leads_and_a_new_auditor_audits_at_once() -> None:
    core = AuditorCore("n2", AuditorConfig(), 0)
    core.on_votes(7, 5, 0)
    assert not core.leading
    assert not core.stale
    core.tick(10_000)
    assert core.take_actions() == []
    core.on_votes(7, 7, 20_000)  # the auditor's vote went: ours is lowest now
    assert core.epoch == 7
    assert core.audit_due_at == 20_000
    core.tick(20_000)
    assert core.take_actions() == [ReadLedgers()]


def test_the_leader_seeing_the_same_election_again_keeps_its_term() -> None:
    # A watch fires for any change of the election's children (a vote joins): the leader
    # is still the lowest, and nothing it knows is forgotten.
    core = _leader()
    core.on_votes(5, 5, 1_000)
    assert core.leading
    assert core.epoch == 5
    assert not core.stale  # no new term, so no audit of a new auditor
    core.on_votes(5, 5, 2_000)
    assert (core.epoch, core.stale) == (5, False)


def test_a_leader_whose_vote_is_no_longer_the_lowest_alive_steps_down() -> None:
    # Its vote went (a session it has not heard is lost) and the lowest left is higher:
    # leading on would make two auditors.
    core = _leader()
    core.on_votes(5, 7, 1_000)
    assert not core.leading


def test_a_session_loss_stops_the_auditor_and_it_joins_again() -> None:
    core = _leader()
    core.on_session_lost()
    assert not core.leading
    assert core.epoch is None
    assert core.vote is None
    core.on_registered({A}, 1_000)  # news for a former auditor: ignored
    core.on_trigger(1_000)
    core.tick(10**9)
    assert core.take_actions() == []
    assert not core.stale
    core.on_votes(None, None, 2_000)
    assert core.take_actions() == [JoinElection("n1")]


def test_an_audit_marks_ledgers_of_lost_and_leaving_bookies_only() -> None:
    ok = _md((Segment(0, (A, B, C)),), closed_at=9)
    lost = _md((Segment(0, (A, B, C)), Segment(5, (A, D, C))), closed_at=9)
    leaving = _md((Segment(0, (B, C, E)),), closed_at=9)
    registered = frozenset({A, B, C, E})
    marks = plan_marks([(1, ok), (2, lost), (3, leaving)], registered, frozenset({E}))
    assert marks == [
        Mark(2, {D: Reason.LOST}, 1),
        Mark(3, {E: Reason.LEAVING}, 1),
    ]
    core = _leader()
    core.on_trigger(5)
    core.tick(5)
    assert core.take_actions() == [ReadLedgers()]
    core.on_ledgers(AuditView(registered, frozenset({E}), [(1, ok), (2, lost), (3, leaving)]))
    assert core.take_actions() == marks
    core.on_trigger(6)
    core.tick(6)
    assert core.take_actions() == [ReadLedgers()]
    core.on_ledgers(None)  # AutoRecovery disabled: nothing published
    assert core.take_actions() == []


def test_a_lost_bookie_is_audited_after_the_delay_on_the_injected_clock() -> None:
    core = _leader(AuditorConfig(lost_bookie_recovery_delay=600))
    core.on_registered(ALL - {A}, 1_000)
    assert core.take_actions() == [ReadDelay(frozenset({A}), frozenset({A}))]
    core.on_delay(60)  # the znode's value wins over the config's
    assert core.stale
    assert core.audit_due_at == 61_000
    assert core.next_wakeup_ms == 61_000
    core.tick(60_999)
    assert core.take_actions() == []
    core.tick(61_000)
    assert core.take_actions() == [ReadLedgers()]
    assert not core.stale


def test_a_second_lost_bookie_or_a_trigger_brings_a_delayed_audit_forward() -> None:
    core = _leader()
    core.on_registered(ALL - {A}, 1_000)
    core.take_actions()
    core.on_delay(60)
    core.on_registered(ALL - {A, B}, 2_000)  # both hold data (the last audit named them)
    assert core.take_actions() == [ReadDelay(frozenset({B}), frozenset({A, B}))]
    core.on_delay(60)
    assert core.audit_due_at == 2_000
    core.tick(2_000)
    assert core.take_actions() == [ReadLedgers()]

    core = _leader()
    core.on_registered(ALL - {D}, 1_000)  # D holds no ledger: one bookie down
    assert core.take_actions() == [ReadDelay(frozenset({D}), frozenset({D}))]
    core.on_delay(60)
    assert core.audit_due_at == 61_000
    core.on_trigger(3_000)
    core.tick(3_000)
    assert core.take_actions() == [ReadLedgers()]


def test_two_bookies_lost_in_one_change_are_audited_without_the_delay() -> None:
    # BookKeeper's Auditor: more than one bookie down ("Multiple bookie failure; not
    # delaying bookie audit"): the two may hold both replicas of an entry (Wq = 2).
    core = _leader()
    core.on_registered(ALL - {A, B}, 1_000)  # both hold data: the last audit named them
    assert core.take_actions() == [ReadDelay(frozenset({A, B}), frozenset({A, B}))]
    core.on_delay(60)
    assert core.audit_due_at == 1_000
    core.tick(1_000)
    assert core.take_actions() == [ReadLedgers()]


def test_a_zero_delay_audits_at_once_and_a_returning_bookie_is_audited_too() -> None:
    core = _leader()
    core.on_registered(ALL - {C}, 1_000)
    core.take_actions()
    core.on_delay(0)
    core.tick(1_000)
    assert core.take_actions() == [ReadLedgers()]
    assert core.audit_due_at is None
    # Any change of the registrations is audited (the spec's bookie_restarts makes the
    # auditor stale): another bookie still down gets its ledgers marked again.
    core.on_registered(ALL, 2_000)
    assert core.take_actions() == []  # no delay to read: nothing was lost
    assert core.next_wakeup_ms == 2_000  # the audit is due now
    core.tick(2_000)
    assert core.take_actions() == [ReadLedgers()]
    with pytest.raises(LocalProtocolError):
        core.on_delay(0)  # no loss asked for it


def test_a_returning_bookie_does_not_hasten_a_delayed_audit() -> None:
    core = _leader()
    core.on_registered(ALL - {C}, 1_000)
    core.take_actions()
    core.on_delay(60)
    core.on_registered(ALL, 2_000)  # C is back within lostBookieRecoveryDelay
    core.tick(2_000)
    assert core.take_actions() == []
    assert core.audit_due_at == 61_000


def test_periodic_bookie_check_audits_and_the_ledger_check_follows_its_interval() -> None:
    core = _leader(AuditorConfig(periodic_check_interval=10, periodic_bookie_check_interval=4))
    assert core.next_wakeup_ms == 4_000
    core.tick(4_000)
    assert core.take_actions() == [ReadLedgers()]
    core.tick(8_000)
    assert core.take_actions() == [ReadLedgers()]
    core.tick(10_000)
    assert core.take_actions() == [CheckLedgers()]
    core.tick(15_000)  # the check is still running: no second one
    assert core.take_actions() == [ReadLedgers()]
    core.on_checked(17_000)
    core.tick(26_999)
    assert CheckLedgers() not in core.take_actions()
    core.tick(27_000)
    assert CheckLedgers() in core.take_actions()


def test_an_interval_of_one_second_is_an_interval_and_zero_disables_the_check() -> None:
    # The intervals are whole seconds: 1 s is the shortest a user can ask for (campaigns
    # and tests do), 0 turns the check off (BookKeeper's auditorPeriodicCheckInterval).
    core = _leader(AuditorConfig(periodic_check_interval=1, periodic_bookie_check_interval=0))
    assert core.next_wakeup_ms == 1_000
    core.tick(1_000)
    assert core.take_actions() == [CheckLedgers()]
    off = _leader(AuditorConfig(periodic_check_interval=0, periodic_bookie_check_interval=0))
    assert off.next_wakeup_ms is None


def test_enabling_autorecovery_audits_at_once_disabling_does_not() -> None:
    core = _leader()
    core.on_enabled(False, 100)
    core.tick(100)
    assert core.take_actions() == []
    core.on_enabled(True, 200)
    core.tick(200)
    assert core.take_actions() == [ReadLedgers()]


def test_the_ledger_check_probes_live_replicas_and_marks_those_missing_and_lost() -> None:
    md = _md((Segment(0, (A, B, C)), Segment(4, (A, B, D))), closed_at=5)
    check = LedgerCheck(9, md, {A, B, C}, 0, random.Random(1))  # D is not registered
    probes: list[Probe] = []
    while not check.done:
        [probe] = check.take_actions()
        assert isinstance(probe, Probe)
        probes.append(probe)
        # A misses one entry of segment 0; every read from C times out.
        verdicts = dict.fromkeys(probe.entries, Verdict.INTACT)
        if probe.fragment.bookie == A:
            verdicts[probe.entries[0]] = Verdict.MISSING
        if probe.fragment.bookie == C:
            verdicts = dict.fromkeys(probe.entries, Verdict.UNKNOWN)
        check.on_probe(probe, verdicts)
    # First and last entry of each fragment; A is not probed again once found bad.
    assert [(p.fragment.segment, p.fragment.bookie, p.entries) for p in probes] == [
        (0, A, (0, 3)),
        (0, B, (0, 3)),
        (0, C, (1, 2)),
        (1, B, (4,)),
    ]
    # D cannot answer: counted lost, as BookKeeper's checker counts it, not probed.
    marked = {A: Reason.ENTRIES_MISSING, D: Reason.LOST}
    assert check.take_actions() == [Mark(9, marked, 0, rewrite=False)]
    with pytest.raises(LocalProtocolError):
        check.on_probe(probes[0], {})


def test_the_ledger_check_reads_every_entry_at_100_percent_and_skips_open_segments() -> None:
    md = _md((Segment(0, (A, B, C)), Segment(10, (A, B, D))))  # open: segment 1 may grow
    check = LedgerCheck(9, md, ALL, 100, random.Random(1))
    seen = []
    while not check.done:
        [probe] = check.take_actions()
        assert isinstance(probe, Probe)
        seen.append(probe.fragment.segment)
        assert probe.entries == tuple(probe.fragment.entries(md))
        check.on_probe(probe, dict.fromkeys(probe.entries, Verdict.INTACT))
    assert seen == [0, 0, 0]
    assert check.take_actions() == []


def test_the_ledger_check_reads_its_percentage_of_the_entries_between_first_and_last() -> None:
    # auditorLedgerVerificationPercentage: 1 % of a 300-entry fragment is 3 entries read
    # besides the first and the last (0 would read those two alone).
    md = _md((Segment(0, (A, B, C)),), closed_at=299, wq=3)  # every replica holds all
    check = LedgerCheck(9, md, ALL, 1, random.Random(1))
    [probe] = check.take_actions()
    assert isinstance(probe, Probe)
    assert (probe.entries[0], probe.entries[-1]) == (0, 299)
    assert len(probe.entries) == 2 + 3


def test_a_percentage_that_rounds_down_to_no_entry_reads_the_first_and_last_alone() -> None:
    # BookKeeper's LedgerChecker.verifyLedgerFragment: (int)(length * pct / 100.0) middle
    # entries, none when that is 0 (a mutation run found bkref reading one all the same).
    md = _md((Segment(0, (A, B, C)),), closed_at=29, wq=3)
    for percentage, middle in ((1, 0), (3, 0), (4, 1), (10, 3)):
        check = LedgerCheck(9, md, ALL, percentage, random.Random(1))
        [probe] = check.take_actions()
        assert isinstance(probe, Probe)
        assert (probe.entries[0], probe.entries[-1]) == (0, 29)
        assert len(probe.entries) == 2 + middle, percentage


def test_the_auditor_config_defaults_are_bookkeepers() -> None:
    """An auditor built without a config (the shell's tests, an embedding) decides as one
    configured with bk_server.conf's defaults does: lostBookieRecoveryDelay 0 and the
    rest, as the bookie config names them."""
    conf = BookieConfig()
    assert conf.lostBookieRecoveryDelay == 0
    assert AuditorConfig() == AuditorConfig(
        conf.lostBookieRecoveryDelay,
        conf.auditorPeriodicCheckInterval,
        conf.auditorPeriodicBookieCheckInterval,
        conf.auditorLedgerVerificationPercentage,
    )


def test_unknown_plants_are_refused() -> None:
    with pytest.raises(UnknownPlantError):
        AuditorCore("n", AuditorConfig(), 0, frozenset({"no-such-bug"}))
