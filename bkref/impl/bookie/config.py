"""Bookie configuration: a TOML file with BookKeeper's parameter names and defaults.

Unknown keys are rejected (a typo must not silently fall back to a default),
and so are values of the wrong type or out of range, and a file with no
parameters at all (an empty or truncated file is a mistake, not "all
defaults"). Times keep BookKeeper's units: ``*MSec``/``flushInterval``/``gcWaitTime`` in
milliseconds, compaction intervals in seconds.
"""

from __future__ import annotations

import logging
import math
import sys
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bkref.impl.storage.bookie_storage import StorageConfig


class ConfigError(ValueError):
    pass


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_FRACTIONS = frozenset(
    {
        "minorCompactionThreshold",
        "majorCompactionThreshold",
        "diskUsageThreshold",
        "diskUsageLwmThreshold",
    }
)


def _check_value(name: str, kind: str, value: object) -> str | None:
    """Why ``value`` is not a valid ``name`` of type ``kind`` (the field's
    annotation), or None. Numbers are finite and never negative."""
    if kind == "bool":
        return None if type(value) is bool else "must be true or false"
    if kind == "str":
        return None if type(value) is str and value else "must be a non-empty string"
    if kind == "list[str]":
        ok = type(value) is list and value and all(type(x) is str and x for x in value)
        return None if ok else "must be a list of non-empty strings"
    if kind == "int":
        if type(value) is not int:
            return "must be an integer"
    elif type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        return "must be a number"
    assert isinstance(value, int | float)
    if name in ("bookiePort", "httpServerPort") and not 1 <= value <= 65535:
        return "must be a port from 1 to 65535"
    if name in _FRACTIONS and not 0 <= value <= 1:
        return "must be a fraction from 0 to 1"
    if name == "auditorLedgerVerificationPercentage" and not 0 <= value <= 100:
        return "must be a percentage from 0 to 100"
    return "must not be negative" if value < 0 else None


@dataclass(frozen=True)
class BookieConfig:
    bookiePort: int = 3181  # noqa: N815 (BookKeeper's names, as in bk_server.conf)
    advertisedAddress: str = "127.0.0.1"  # noqa: N815
    journalDirectory: str = "/tmp/bk-txn"  # noqa: N815, S108
    ledgerDirectories: list[str] = field(default_factory=lambda: ["/tmp/bk-data"])  # noqa: N815, S108
    zkServers: str = "127.0.0.1:2181"  # noqa: N815
    zkLedgersRootPath: str = "/ledgers"  # noqa: N815
    zkTimeout: int = 10000  # noqa: N815
    rack: str = "/default-rack"  # the failure domain (BookKeeper resolves it from the network)
    journalSyncData: bool = True  # noqa: N815
    journalMaxGroupWaitMSec: float = 2.0  # noqa: N815
    journalBufferedWritesThreshold: int = 524288  # noqa: N815
    journalFlushWhenQueueEmpty: bool = False  # noqa: N815
    journalMaxSizeMB: int = 2048  # noqa: N815
    flushInterval: int = 60000  # noqa: N815
    logSizeLimit: int = 1073741824  # noqa: N815
    gcWaitTime: int = 600000  # noqa: N815
    gcOverreplicatedLedgerWaitTime: int = 86400000  # noqa: N815 (ms)
    minorCompactionThreshold: float = 0.2  # noqa: N815
    minorCompactionInterval: int = 3600  # noqa: N815
    majorCompactionThreshold: float = 0.8  # noqa: N815
    majorCompactionInterval: int = 86400  # noqa: N815
    readOnlyModeEnabled: bool = True  # noqa: N815
    diskUsageThreshold: float = 0.95  # noqa: N815
    diskUsageLwmThreshold: float = 0.90  # noqa: N815
    diskCheckInterval: int = 10000  # noqa: N815
    nettyMaxFrameSizeBytes: int = 5242880  # noqa: N815
    # BookKeeper's HTTP server: /metrics (Prometheus) and the admin API (bkref.impl.metrics).
    httpServerEnabled: bool = False  # noqa: N815
    httpServerPort: int = 8080  # noqa: N815
    # AutoRecovery (auditor and replication worker), BookKeeper's names and defaults.
    autoRecoveryDaemonEnabled: bool = False  # noqa: N815
    lostBookieRecoveryDelay: int = 0  # noqa: N815 (seconds)
    openLedgerRereplicationGracePeriod: int = 30000  # noqa: N815 (ms)
    auditorPeriodicCheckInterval: int = 604800  # noqa: N815 (seconds; 0 disables)
    auditorPeriodicBookieCheckInterval: int = 86400  # noqa: N815 (seconds; 0 disables)
    auditorLedgerVerificationPercentage: int = 0  # noqa: N815 (entries read beyond first/last)
    rwRereplicateBackoffMs: int = 5000  # noqa: N815
    # Beyond BookKeeper (replica management): per-bookie repair slots and task priorities.
    repairSlotsPerBookie: int = 4  # noqa: N815
    repairDeprioritizeAfterFailures: int = 5  # noqa: N815
    repairPromoteAfterMs: int = 1800000  # noqa: N815

    @property
    def bookie_id(self) -> str:
        return f"{self.advertisedAddress}:{self.bookiePort}"

    def storage(self) -> StorageConfig:
        return StorageConfig(
            journal_sync_data=self.journalSyncData,
            journal_max_group_wait_ms=self.journalMaxGroupWaitMSec,
            journal_buffered_writes_threshold=self.journalBufferedWritesThreshold,
            journal_flush_when_queue_empty=self.journalFlushWhenQueueEmpty,
            journal_max_size=self.journalMaxSizeMB * 1024 * 1024,
            entry_log_size_limit=self.logSizeLimit,
        )

    @staticmethod
    def from_dict(d: dict[str, Any], source: str = "config") -> BookieConfig:
        known = {f.name: f for f in fields(BookieConfig)}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ConfigError(
                f"{source}: unknown parameter(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(known))}"
            )
        if "ledgerDirectories" in d and isinstance(d["ledgerDirectories"], str):
            d = {**d, "ledgerDirectories": [d["ledgerDirectories"]]}
        for name, value in d.items():
            why = _check_value(name, str(known[name].type), value)
            if why is not None:
                raise ConfigError(f"{source}: {name} {why}, got {value!r}")
        cfg = BookieConfig(**d)
        if len(cfg.ledgerDirectories) != 1:
            raise ConfigError(
                f"{source}: exactly one ledger directory is supported, got {cfg.ledgerDirectories}"
            )
        if cfg.advertisedAddress != "127.0.0.1":
            raise ConfigError(
                f"{source}: advertisedAddress must be 127.0.0.1 (bkref serves only on the loopback)"
            )
        return cfg

    @staticmethod
    def load(path: Path) -> BookieConfig:
        try:
            with path.open("rb") as f:
                d = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read bookie config {path}: {e.strerror or e}") from e
        except UnicodeDecodeError:
            raise ConfigError(
                f"cannot read bookie config {path}: not UTF-8 text; expected TOML"
            ) from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"cannot read bookie config {path}: not valid TOML: {e}") from e
        if not d:
            raise ConfigError(
                f"{path}: no parameters; expected a TOML bookie config (bookiePort, "
                "journalDirectory, ledgerDirectories, zkServers, ...)"
            )
        return BookieConfig.from_dict(d, str(path))

    def to_toml(self) -> str:
        lines = []
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool):
                lines.append(f"{f.name} = {'true' if v else 'false'}")
            elif isinstance(v, int | float):
                lines.append(f"{f.name} = {v}")
            elif isinstance(v, list):
                lines.append(f"{f.name} = [{', '.join(_q(x) for x in v)}]")
            else:
                lines.append(f"{f.name} = {_q(v)}")
        return "\n".join(lines) + "\n"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def load_for_cli(prog: str, path: Path, log_level: str) -> BookieConfig | None:
    """Set up logging and load ``path`` for a command; None (error printed) if unusable."""
    if log_level.upper() not in LOG_LEVELS:
        print(
            f"{prog}: --log-level {log_level}: expected one of {', '.join(LOG_LEVELS)}",
            file=sys.stderr,
        )
        return None
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return BookieConfig.load(path)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
