"""ZooKeeper paths, after BookKeeper's layout (HierarchicalLedgerManager).

A ledger id is written as 10 digits and split 2/4/4: ledger 1234567890 lives at
``/ledgers/12/3456/L7890``. Bookies register ephemeral znodes under
``/ledgers/available/`` (and ``/ledgers/available/readonly/``); cookies live
under ``/ledgers/cookies/``; the cluster's instance id at ``/ledgers/INSTANCEID``.
"""

from __future__ import annotations

DEFAULT_ROOT = "/ledgers"
READONLY = "readonly"


def ledger_path(root: str, ledger_id: int) -> str:
    if not 0 <= ledger_id < 10**10:
        raise ValueError(f"ledger id {ledger_id} does not fit the 10-digit hierarchical layout")
    s = f"{ledger_id:010d}"
    return f"{root}/{s[:2]}/{s[2:6]}/L{s[6:]}"


def ledger_id_from_path(parts: tuple[str, str, str]) -> int:
    """The id from the three path components under the root (``"12", "3456", "L7890"``)."""
    a, b, c = parts
    return int(a + b + c[1:])


def available(root: str) -> str:
    return f"{root}/available"


def readonly(root: str) -> str:
    return f"{root}/available/{READONLY}"


def cookies(root: str) -> str:
    return f"{root}/cookies"


def idgen(root: str) -> str:
    return f"{root}/idgen"


def instance_id(root: str) -> str:
    return f"{root}/INSTANCEID"


def underreplication(root: str) -> str:
    return f"{root}/underreplication"


def decommissioning(root: str) -> str:
    """Bookies being decommissioned: new ensembles and repairs avoid them."""
    return f"{root}/underreplication/decommission"


def layout(root: str) -> str:
    return f"{root}/LAYOUT"


# Top-level names under the root that are not ledger id prefixes.
RESERVED = {"available", "cookies", "idgen", "INSTANCEID", "LAYOUT", "underreplication"}
