"""Planted bugs: each is caught by the campaign's checks, and the same seed without it is valid.

A campaign that cannot fail proves nothing. ``bkref.impl.core.planted`` switches on
known ways to break BookKeeper's guarantees; these tests run short campaigns
with and without each switch, with seeds that trigger it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

from bkref.impl.client.client import BookKeeper
from bkref.impl.cluster.local import LocalCluster
from bkref.impl.core.planted import CAMPAIGN_PLANTS, PLANTS, UnknownPlantError, active, validate
from bkref.linearizability.anomalies import ANOMALY_KINDS
from bkref.linearizability.history import Recorder
from bkref.linearizability.history_files import JsonlWriter
from bkref.nemesis.backends import make_backend
from bkref.nemesis.backends.local import LocalBackend
from bkref.nemesis.backends.netns import LazyfsNamespaceBackend
from bkref.nemesis.cli import _fault_length
from bkref.nemesis.cli import _parser as campaign_parser
from bkref.nemesis.faults import expand_kinds
from bkref.nemesis.netns import namespaces_supported
from bkref.nemesis.planted import EXERCISES
from bkref.nemesis.runner import RunResult, RunSpec, run_once
from bkref.nemesis.workload import Workload, WorkloadSpec

# A campaign, its convergence and its checks: the trace check's budget alone is 300 s, the
# default timeout, and under load a run takes twice as long and must still pass.
pytestmark = pytest.mark.timeout(900)

SUPPORTED, WHY = namespaces_supported()
SMALL = WorkloadSpec(writers=2, readers=1, in_flight=4, entries_per_ledger=40)
# Ledgers longer than a run: every ledger open on an expired bookie stays open, and its
# writer keeps adding, from the expiry through the repair to the end of the safety phase.
LONG = WorkloadSpec(entries_per_ledger=100_000)

# The anomaly kinds that show each planted bug was caught, in any of the run's checks.
# Which kinds of its family a run shows depends on timing (under load every add a
# racing recovery overtakes may have been sent before it completed: lost-write, no
# ack-after-fence); that the run shows one of them does not. Kinds outside a bug's
# family do not count: a run invalid for another reason has not caught this bug.
FAMILIES: dict[str, frozenset[str]] = {
    # A writer keeps being acknowledged after a recovery closed its ledger: an
    # acknowledged add the closed ledger does not hold. The ledger checker calls it
    # lost-write if the add was sent before the close completed and ack-after-fence if
    # after; the durability check calls both lost-write (beyond the final recovery's
    # last entry).
    "recovery-reads-without-fence": frozenset({"lost-write", "ack-after-fence"}),
    # Acknowledged entries vanish from every replica. Beyond the last entry recovery
    # finds: lost-write (both checks). Below it, where the final reads find nothing:
    # lost-write (durability) and stale-read (the ledger checker: "no such entry" for
    # an entry known to exist), the ledger checker's only name when the final reads
    # never ran and only a reader during the run saw the entry gone.
    # Or lost from fewer than all replicas: the metadata still names the bookie that
    # forgot them and no bookie is missing, so nothing re-replicates them, and the full
    # replica check after convergence finds them missing: under-replicated.
    "ack-before-fsync": frozenset({"lost-write", "stale-read", "under-replicated"}),
    # The metadata names a bookie that never got the entries. Every read still finds
    # the other replica, so only the replication audit of the bookies' dumps sees it.
    "repair-without-copy": frozenset({"under-replicated"}),
    # The new replica lacks entries acknowledged after the copy, and one negative read
    # from it lets a recovery close the ledger before them: acknowledged adds the closed
    # ledger does not hold, named as for recovery-reads-without-fence.
    "repair-open-segment-without-fence": frozenset({"lost-write", "ack-after-fence"}),
}


def test_plants_are_checked_names_passed_as_arguments() -> None:
    assert validate([]) == frozenset()
    assert validate(["ack-before-fsync"]) == {"ack-before-fsync"}
    with pytest.raises(UnknownPlantError, match="ack-before-sync"):
        validate(["ack-before-sync"])
    assert all(active(name, frozenset(PLANTS)) for name in PLANTS)
    assert not any(active(name, frozenset()) for name in PLANTS)
    with pytest.raises(UnknownPlantError):
        active("no-such-bug", frozenset())
    with pytest.raises(UnknownPlantError, match="ack-before-sync"):
        active("ack-before-fsync", frozenset({"ack-before-sync"}))


BKREF = [sys.executable, "-m", "bkref.impl.cli.main"]


@pytest.mark.parametrize(
    ("command", "required"),
    [
        ([*BKREF, "bookie"], ["--config", "x"]),
        ([*BKREF, "autorecovery"], ["--config", "x"]),
        ([*BKREF, "shell", "listbookies"], ["--zk", "x"]),
        ([sys.executable, "-m", "bkref.nemesis.writer_proc"], ["--zk", "x"]),
    ],
    ids=["bookie", "autorecovery", "shell", "writer_proc"],
)
def test_every_process_that_hosts_a_plant_takes_it_on_its_command_line(
    command: list[str], required: list[str]
) -> None:
    shown = subprocess.run(
        [*command, "--help"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0, shown.stderr
    assert "--plant NAME" in shown.stdout
    assert "planted bug" in shown.stdout
    # An unknown name is a usage error before anything starts, naming the known ones.
    refused = subprocess.run(
        [*command, *required, "--plant", "ack-before-sync"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2
    assert "invalid choice: 'ack-before-sync'" in refused.stderr
    assert "ack-before-fsync" in refused.stderr


class _Started:
    """Stands for subprocess.Popen: records the command line, starts nothing."""

    argv: ClassVar[list[str]] = []

    def __init__(self, argv: list[str], **_: object) -> None:
        _Started.argv = argv
        self.pid = 2**22 + 1  # above pid_max: never a process

    def poll(self) -> int:
        return 0


def test_the_campaign_passes_its_plants_to_the_processes_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = make_backend("local", tmp_path, 3, plants=frozenset({"ack-before-fsync"}))
    assert isinstance(backend, LocalBackend)
    assert backend.plants == {"ack-before-fsync"}
    # A bookie's command line names the plant; so does the state `bkref cluster` reads back.
    monkeypatch.setattr("bkref.impl.cluster.local.subprocess.Popen", _Started)
    monkeypatch.setattr(LocalCluster, "_owners", lambda self, indexes: {})
    backend.cluster._zk_hosts = "127.0.0.1:1"
    backend.cluster.add_bookie(wait=False)
    assert _Started.argv[-2:] == ["--plant", "ack-before-fsync"]
    assert LocalCluster.load(tmp_path).plants == {"ack-before-fsync"}
    # The campaign's writer processes get the same.
    bk = BookKeeper("127.0.0.1:1", plants=backend.plants)  # not started: nothing connects
    with JsonlWriter(tmp_path / "history.jsonl") as writer:
        workload = Workload(bk, Recorder(writer), SMALL, random.Random(1), plants=backend.plants)
        assert workload.writer_argv()[-2:] == ["--plant", "ack-before-fsync"]
    spec = RunSpec(seed=1, plant=("recovery-reads-without-fence",))
    with pytest.raises(ValueError, match="make the backend with plants"):
        run_once(spec, backend, tmp_path / "run", lambda _: None)


def test_make_planted_exercises_every_planted_bug_with_faults_that_exist() -> None:
    assert set(EXERCISES) == set(CAMPAIGN_PLANTS)  # a new planted bug needs its campaign
    for ex in EXERCISES.values():
        assert expand_kinds(ex.faults.split(","))  # raises on an unknown fault kind
        args = campaign_parser().parse_args(["--faults", ex.faults, *ex.extra])
        _fault_length(args.fault_length)  # raises on a malformed length


def _run(tmp_path: Path, spec: RunSpec, netns: bool) -> RunResult:
    plants = frozenset(spec.plant)
    traces = tmp_path / "run" / "traces" if spec.trace else None
    backend = (
        LazyfsNamespaceBackend(
            tmp_path / "cluster",
            spec.bookies,
            plants=plants,
            registry_dir=tmp_path / "registry",
            trace_dir=traces,
        )
        if netns
        else LocalBackend(
            tmp_path / "cluster", bookies=spec.bookies, plants=plants, trace_dir=traces
        )
    )
    before = dict(os.environ)
    result = run_once(spec, backend, tmp_path / "run", lambda _: None)
    assert dict(os.environ) == before  # plants are arguments: the run leaves it alone
    assert result.error is None, result.error
    return result


def anomaly_kinds(result: RunResult, *, without: str = "") -> set[str]:
    """The anomaly kinds of every check of the run but ``without`` (counts include those
    not listed)."""
    checks = [c for name, c in result.checks.items() if name != without]
    listed = {a["kind"] for c in checks for a in c["anomalies"]}
    counted = {k for c in checks for k, n in c.get("counts", {}).items() if n}
    return listed | counted


def caught(result: RunResult, plant: str) -> set[str]:
    """The kinds of ``plant``'s family the run's checks found."""
    return anomaly_kinds(result) & FAMILIES[plant]


def _counts(result: RunResult) -> dict[str, object]:
    return {k: c.get("counts") for k, c in result.checks.items()}


def trace_caught(result: RunResult, says: str) -> bool:
    """Whether the run's trace check found a step no spec behaviour allows, for the
    reason a planted bug must cause (``says``, a part of the reason)."""
    return any(says in a["message"] for a in result.checks["trace"]["anomalies"])


def test_every_planted_bug_has_a_family_of_anomaly_kinds_the_checks_report() -> None:
    assert set(FAMILIES) == set(CAMPAIGN_PLANTS)
    replication = {"under-replicated", "digest-mismatch"}  # bkref/linearizability/replication.py
    for family in FAMILIES.values():
        assert family
        assert family <= set(ANOMALY_KINDS) | replication


@pytest.mark.zookeeper
@pytest.mark.slow
@pytest.mark.parametrize("plant", [("recovery-reads-without-fence",), ()])
def test_recovery_without_fence_is_caught_and_the_same_seed_is_valid_without_it(
    tmp_path: Path, plant: tuple[str, ...]
) -> None:
    # No faults needed: every ledger is recovered by another client while its writer adds
    # (race_probability=1), so a planted run's first recovery sends an unfenced fencing
    # read, which the trace check's replay through the spec refuses: caught in every run.
    # (With the workload's 0.2, a loaded verify run of 2026-12-01 made 7 ledgers in its
    # 6 s, all closed by their writers, so no recovery fenced anything and the plant
    # never ran: the final phase's recovery of a closed ledger sends no fencing read.)
    # The history checks see the bug only when a writer kept adding after a recovery
    # closed its ledger, which the machine's load decides (a loaded verify run saw it in
    # none of seeds 1-3); `make planted` holds them to it with campaigns of the default
    # length. Here they must name nothing outside the bug's family.
    racing = replace(SMALL, race_probability=1.0)
    spec = RunSpec(
        seed=1, duration=6.0, faults=(), bookies=3, workload=racing, plant=plant, trace=True
    )
    result = _run(tmp_path, spec, netns=False)
    if plant:
        assert result.valid is False
        assert trace_caught(result, "without the fence flag"), _counts(result)
        assert anomaly_kinds(result, without="trace") <= FAMILIES[plant[0]], _counts(result)
    else:
        assert result.valid is True, result.checks
        assert result.checks["trace"]["counts"]["explained"] > 0


@pytest.mark.zookeeper
@pytest.mark.slow
@pytest.mark.skipif(not SUPPORTED, reason=f"no network namespaces here: {WHY}")
@pytest.mark.parametrize(
    "plant",
    [
        # The planted run (about 100 CPU s, its trace check's 300 s budget spent on the
        # ledgers the power loss left undecidable): `make planted` runs the plant's
        # campaigns, and verify catches it in the refinement machine (config m-journal).
        pytest.param(("ack-before-fsync",), marks=pytest.mark.full),
        # The control, left to `make verify-full` with its plant: verify's namespace
        # campaign (test_campaign.py) drops unsynced writes among its faults, valid.
        pytest.param((), marks=pytest.mark.full),
    ],
)
def test_ack_before_fsync_loses_acked_entries_on_lazyfs_and_the_same_seed_is_valid_without_it(
    tmp_path: Path, plant: tuple[str, ...]
) -> None:
    # Bookies on lazyfs, killed with their unsynced writes dropped.
    # Two crashes of the two bookies of one write set lose its acked entries.
    spec = RunSpec(
        seed=3,
        duration=12.0,
        faults=("lose-unsynced",),
        bookies=4,
        workload=SMALL,
        plant=plant,
        interval=2.0,
        # Entries lost from every replica can never be repaired, so the planted run would
        # wait out the whole convergence timeout (180 s) for nothing: what the bug must
        # cause is in the history's final reads, which come before convergence.
        converge_timeout=30.0 if plant else RunSpec.converge_timeout,
        trace=True,
    )
    result = _run(tmp_path, spec, netns=True)
    # Both crashes happened: the schedule is the seed's (windows 3.6 s and 9.5 s into the
    # run), and the nemesis counts each window it opened, whatever the timing.
    assert result.faults.get("lose-unsynced", 0) >= 2
    if plant:
        assert result.valid is False
        # A bookie restarted without entries it had acknowledged: the trace check sees it
        # in the bookie's own replay, whatever the histories' reads saw.
        assert trace_caught(result, "came back without"), _counts(result)
        # The history checks and the replication audit see it only if the entries the
        # crashes dropped are still in the ledger's final copies, which the machine's load
        # decides: a loaded verify run's saw none. `make planted` holds them to it with
        # campaigns of the default length; here they must name nothing outside its family,
        # but that entries lost from every replica cannot be repaired: the cluster does not
        # converge (the planted run waits 30 s for it, above).
        expected = FAMILIES[plant[0]] | {"not-repaired-after-heal"}
        assert anomaly_kinds(result, without="trace") <= expected, _counts(result)
    else:
        assert result.valid is True, result.checks
        assert result.checks["trace"]["counts"]["explained"] > 0


@pytest.mark.zookeeper
@pytest.mark.slow
# Both left to `make verify-full` (40-120 CPU s each: up to three campaigns until one is
# caught): in verify, the refinement machine catches this bug on config c-short and
# replays its counterexample without the plant as the control
# (tests/refine/test_bkref_planted.py), as for ack-before-fsync above.
@pytest.mark.full
@pytest.mark.parametrize("plant", [("repair-without-copy",), ()])
def test_repair_without_copy_is_caught_by_the_replication_audit_and_the_seed_is_valid_without(
    tmp_path: Path, plant: tuple[str, ...]
) -> None:
    # Bookies killed for twice their session (4 s) or more: the auditor marks their ledgers
    # and AutoRecovery repairs them. (Kills of the default 1-6 s barely outlive a session;
    # whether one did was a matter of ZooKeeper's tick, and a CI run saw none repaired.)
    # Without the copy the metadata names bookies that lack the entries; only the
    # audit of the bookies' dumps can see that (every read still finds a replica).
    # Whether a worker swaps a bookie before the killed one is back, rather than finding
    # it back, is the machine's timing: a verify run beside two CPU-bound processes saw
    # seed 1's marks resolved by the restart alone. So the planted case tries up to three
    # seeds and must be caught in one (each run still has its kill and its marks).
    found: list[dict[str, object]] = []
    for seed in (1, 2, 3) if plant else (1,):
        spec = RunSpec(
            seed=seed,
            duration=20.0,
            faults=("kill",),
            bookies=4,
            workload=SMALL,
            plant=plant,
            fault_length=(8.0, 12.0),
        )
        result = _run(tmp_path / f"seed-{seed}", spec, netns=False)
        assert result.faults.get("kill", 0) >= 1
        assert max(n for _, n in result.under_replicated) > 0  # the auditor marked ledgers
        if not plant:
            assert result.valid is True, result.checks
            assert result.checks["replication"]["entries_audited"] > 0
            return
        kinds = caught(result, plant[0])
        found.append({"seed": seed, "caught": sorted(kinds), "counts": _counts(result)})
        if kinds:
            assert result.valid is False
            assert result.checks["durability"]["valid"]
            return
    raise AssertionError(f"{plant[0]} caught in none of the runs: {found}")


# Up to three campaigns of 30 s (about 110 CPU s): `make planted` runs the plant's
# campaigns, and verify catches it in the refinement machine (config m-open-segment).
@pytest.mark.full
@pytest.mark.zookeeper
@pytest.mark.slow
@pytest.mark.skipif(not SUPPORTED, reason=f"no network namespaces here: {WHY}")
def test_repairing_an_open_segment_without_fencing_loses_acked_entries_in_one_of_three_runs(
    tmp_path: Path,
) -> None:
    # A bookie cut from ZooKeeper (expire) is lost to the auditor but still takes the
    # writer's adds. The planted worker copies its open segment up to the LAC and swaps
    # in a new bookie without fencing; adds acknowledged after the copy are missing from
    # the new replica, and with Wq = Aq one negative read from it lets recovery close the
    # ledger before them. Ledgers outlive the run (LONG), so every ledger whose ensemble
    # holds the expired bookie is repaired that way while its writer adds; ledgers of
    # 1,500 entries lived a few seconds, and in a CI run none was open at the repair in
    # three seeds. Which read reaches a recovery first is still timing, so the bar is
    # detection in at least one of three runs.
    plant = ("repair-open-segment-without-fence",)
    found: list[dict[str, object]] = []
    for seed in (1, 2, 3):
        spec = RunSpec(
            seed=seed, duration=30.0, faults=("expire",), workload=LONG, bookies=5, plant=plant
        )
        result = _run(tmp_path / f"seed-{seed}", spec, netns=True)
        kinds = caught(result, plant[0])
        found.append({"seed": seed, "caught": sorted(kinds), "counts": _counts(result)})
        if kinds:
            assert result.valid is False
            break
    assert any(f["caught"] for f in found), found


@pytest.mark.zookeeper
@pytest.mark.slow
@pytest.mark.skipif(not SUPPORTED, reason=f"no network namespaces here: {WHY}")
@pytest.mark.full  # the control of the planted run above, which is full too
def test_the_same_expiry_campaign_without_the_open_segment_plant_is_valid(tmp_path: Path) -> None:
    spec = RunSpec(seed=1, duration=30.0, faults=("expire",), workload=LONG, bookies=5)
    result = _run(tmp_path, spec, netns=True)
    assert result.faults.get("expire", 0) >= 1
    assert result.valid is True, {k: c["anomalies"][:3] for k, c in result.checks.items()}


_TEARDOWN = """
import pathlib, signal, sys, time

def tear_down(signum, frame):
    time.sleep(1.0)  # longer than subprocess.run's quarter second before its SIGKILL
    pathlib.Path(sys.argv[1]).write_text("torn down")
    sys.exit(0)

signal.signal(signal.SIGINT, tear_down)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
pathlib.Path(sys.argv[2]).write_text("ready")
time.sleep(60)
"""

_PARENT = """
import signal, sys
# A terminal's foreground job starts with Ctrl-C's default action. The test runner's
# process may ignore or block SIGINT (both pass through exec), and Python installs no
# KeyboardInterrupt handler for an ignored SIGINT: set what a shell would.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
from bkref.nemesis.planted import run_to_end
try:
    run_to_end(sys.argv[1:])
except KeyboardInterrupt:
    sys.exit(130)
sys.exit(0)
"""


def test_ctrl_c_waits_for_the_campaign_to_tear_its_cluster_down(tmp_path: Path) -> None:
    """A Ctrl-C reaches `make planted` and its campaign alike (one foreground process
    group); the campaign tears its cluster down, and planted must wait for that, not
    kill it, then stop. The stand-in campaign takes a second to tear down."""
    torn, ready = tmp_path / "torn", tmp_path / "ready"
    child = [sys.executable, "-c", _TEARDOWN, str(torn), str(ready)]
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, *child],
        start_new_session=True,  # its own process group, as a terminal's job is
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(200):
            if ready.exists():
                break
            parent.poll()
            assert parent.returncode is None, parent.stderr
            time.sleep(0.05)
        assert ready.exists()
        os.killpg(parent.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        _, err = parent.communicate(timeout=30)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 130, f"{err}; the test runner's signals: {_signals()}"
    assert torn.read_text() == "torn down"
    assert "waiting for the campaign to tear its cluster down" in err


def _signals() -> str:
    """This process's ignored and blocked signal masks (/proc), for a failure's message."""
    status = Path(f"/proc/{os.getpid()}/status").read_text().splitlines()
    return " ".join(ln for ln in status if ln.startswith(("SigIgn", "SigBlk")))
