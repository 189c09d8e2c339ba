"""The trace actions the projection and the replay name, and what they mean to them."""

from __future__ import annotations

RECEIPTS = frozenset(
    {
        "writer_receives_add_response",
        "recovery_client_receives_add_response",
        "recovery_client_receives_fencing_response",
        "recovery_client_receives_read_response",
    }
)
HANDLES = frozenset(
    {"bookie_handles_add", "bookie_handles_fencing_lac_read", "bookie_handles_recovery_read"}
)
# What a bookie answers with when it handled the request as the spec's bookie does;
# any other status (I/O error, read-only, bad request) is a request the bookie did not
# take, which the spec sees as a lost message.
TAKEN = frozenset({"OK", "FENCED", "NO_SUCH_ENTRY", "NO_SUCH_LEDGER"})

ADD = "writer_sends_add"  # the writer makes an entry: sent, or queued during a change

# AutoRecovery's steps of a ledger: the auditor's marks and the worker's attempts.
MARKS = frozenset({"auditor_marks_ledgers_of_lost_bookies", "auditor_checks_ledger_replicas"})
COPY, CAS = "worker_copies_fragment", "worker_updates_segment_ensemble"
LOCK, RELEASE = "worker_acquires_ledger_lock", "worker_releases_lock"
REASONS = frozenset({"LOST", "ENTRIES_MISSING"})  # why the spec's auditor marks a replica
