"""AutoRecovery: the auditor, replication workers and manual recovery."""
