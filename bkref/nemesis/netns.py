"""A private network of Linux network namespaces for a local campaign.

Each node (ZooKeeper server, bookie, client) gets a namespace of its own with
one interface, ``eth0``, joined by a veth pair to a bridge that lives in a
namespace of its own. Addresses come from a private /24 that exists only
inside these namespaces. Every link is created *inside* the bridge namespace
with its peer placed straight into the node's namespace, so the host's network
namespace is never touched: no links, routes or firewall rules appear there.

Partitions are real: a grudge (see :mod:`bkref.nemesis.partition`) becomes iptables
DROP rules in the INPUT chain of each node's namespace, loaded atomically with
``iptables-restore``.

Everything created is first recorded in a registry file, with the PID and
start time of the process that created it, so that ``cleanup_leftovers``
(``bkref campaign cleanup``) removes what a crashed or interrupted run left
behind; it deletes only namespaces named in a registry whose owner is gone,
never those of a run still in progress.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bkref.nemesis.partition import Grudge

PREFIX = "bkref-"


class NetnsError(RuntimeError):
    """A namespace, link or firewall command failed; the message has its stderr."""


def default_registry_dir() -> Path:
    base = Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
    return base / "bkref" / "netns"


def _run(argv: Sequence[str], *, input_text: str | None = None) -> str:
    try:
        done = subprocess.run(
            list(argv), input=input_text, capture_output=True, text=True, check=False
        )
    except FileNotFoundError as e:
        raise NetnsError(
            f"{argv[0]} is not installed; run `make setup` (it installs iproute2 and iptables)"
        ) from e
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def list_namespaces() -> set[str]:
    out = _run(["ip", "netns", "list"])
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def namespaces_supported() -> tuple[bool, str]:
    """Whether this process may create network namespaces, and if not, why."""
    if shutil.which("ip") is None:
        return False, "`ip` (iproute2) is not installed; run `make setup`"
    if os.geteuid() != 0:
        return False, f"network namespaces need root; running as uid {os.geteuid()}"
    probe = f"{PREFIX}probe-{secrets.token_hex(3)}"
    try:
        _run(["ip", "netns", "add", probe])
    except NetnsError as e:
        return False, f"cannot create a network namespace: {e}"
    _run(["ip", "netns", "del", probe])
    return True, "ok"


@dataclass(frozen=True)
class NetNode:
    """A node of the private network: its name, namespace and address."""

    name: str
    netns: str
    ip: str


class NamespaceNetwork:
    """Namespaces, a bridge and veth links for ``node_names``; iptables partitions."""

    def __init__(
        self,
        node_names: Sequence[str],
        *,
        run_id: str | None = None,
        subnet: str = "10.77.0",
        registry_dir: Path | None = None,
    ) -> None:
        if len(set(node_names)) != len(node_names):
            raise ValueError(f"node names must be unique: {list(node_names)}")
        if not 1 <= len(node_names) <= 250:
            raise ValueError("between 1 and 250 nodes fit in one /24")
        self.run_id = run_id or secrets.token_hex(3)
        self.subnet = subnet
        self.bridge_ns = f"{PREFIX}{self.run_id}-br"
        self.nodes: dict[str, NetNode] = {
            name: NetNode(name, f"{PREFIX}{self.run_id}-{name}", f"{subnet}.{i + 10}")
            for i, name in enumerate(node_names)
        }
        self.registry = (registry_dir or default_registry_dir()) / f"{self.run_id}.json"

    # ------------------------------------------------------------ lifecycle

    def setup(self) -> None:
        """Create the namespaces, the bridge and one veth link per node."""
        self._record()
        _run(["ip", "netns", "add", self.bridge_ns])
        self._ns(self.bridge_ns, "ip", "link", "add", "br0", "type", "bridge")
        self._ns(self.bridge_ns, "ip", "link", "set", "br0", "up")
        for i, node in enumerate(self.nodes.values()):
            _run(["ip", "netns", "add", node.netns])
            port = f"p{i}"
            # Created inside the bridge namespace, peer moved straight into the
            # node's namespace: the host namespace never sees either end.
            self._ns(
                self.bridge_ns,
                *("ip", "link", "add", port, "type", "veth"),
                *("peer", "name", "eth0", "netns", node.netns),
            )
            self._ns(self.bridge_ns, "ip", "link", "set", port, "master", "br0")
            self._ns(self.bridge_ns, "ip", "link", "set", port, "up")
            self._ns(node.netns, "ip", "addr", "add", f"{node.ip}/24", "dev", "eth0")
            self._ns(node.netns, "ip", "link", "set", "eth0", "up")
            self._ns(node.netns, "ip", "link", "set", "lo", "up")

    def teardown(self) -> None:
        """Delete every namespace of this network (their links go with them)."""
        existing = list_namespaces()
        for ns in [*(n.netns for n in self.nodes.values()), self.bridge_ns]:
            if ns in existing:
                _run(["ip", "netns", "del", ns])
        self.registry.unlink(missing_ok=True)

    def _record(self) -> None:
        self.registry.parent.mkdir(parents=True, exist_ok=True)
        entry = {
            "run_id": self.run_id,
            "namespaces": [n.netns for n in self.nodes.values()] + [self.bridge_ns],
            "owner": owner(),
        }
        self.registry.write_text(json.dumps(entry) + "\n")

    # ------------------------------------------------------------ use

    def exec_argv(self, node: str, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside ``node``'s namespace."""
        return ["ip", "netns", "exec", self.nodes[node].netns, *argv]

    def run(self, node: str, *argv: str, input_text: str | None = None) -> str:
        """Run a command inside ``node``'s namespace; its stdout (NetnsError if it fails)."""
        return self._ns(self.nodes[node].netns, *argv, input_text=input_text)

    def load_nat(self, node: str, rules: Sequence[str]) -> None:
        """Replace the nat table of ``node``'s namespace (the filter table is left alone)."""
        table = "\n".join(
            [
                *("*nat", ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]"),
                *(":OUTPUT ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]"),
                *rules,
                *("COMMIT", ""),
            ]
        )
        self.run(node, "iptables-restore", input_text=table)

    def _ns(self, netns: str, *argv: str, input_text: str | None = None) -> str:
        return _run(["ip", "netns", "exec", netns, *argv], input_text=input_text)

    def apply_grudge(self, grudge: Mapping[str, frozenset[str]] | Grudge) -> None:
        """Replace the current partition: each node drops packets from its grudge."""
        unknown = (set(grudge) | {m for g in grudge.values() for m in g}) - set(self.nodes)
        if unknown:
            raise ValueError(f"grudge names unknown node(s): {sorted(unknown)}")
        for name, node in self.nodes.items():
            rules = [
                f"-A INPUT -s {self.nodes[m].ip}/32 -j DROP" for m in sorted(grudge.get(name, ()))
            ]
            self._load_filter(node.netns, rules)

    def heal(self) -> None:
        """Remove every partition rule."""
        for node in self.nodes.values():
            self._load_filter(node.netns, [])

    def _load_filter(self, netns: str, rules: list[str]) -> None:
        table = "\n".join(
            [
                *(
                    "*filter",
                    ":INPUT ACCEPT [0:0]",
                    ":FORWARD ACCEPT [0:0]",
                    ":OUTPUT ACCEPT [0:0]",
                ),
                *rules,
                *("COMMIT", ""),
            ]
        )
        self._ns(netns, "iptables-restore", input_text=table)


def owner() -> dict[str, int]:
    """This process, as a registry records it: PID and start time (PIDs are re-used)."""
    return {"pid": os.getpid(), "start": _start_time(os.getpid())}


def _start_time(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def owner_alive(entry: Mapping[str, object]) -> bool:
    """True if the process that wrote a registry entry still runs: not a leftover."""
    who = entry.get("owner")
    if not isinstance(who, dict):
        return False
    pid, start = int(who.get("pid", -1)), int(who.get("start", -2))
    return pid > 0 and _start_time(pid) == start


def cleanup_leftovers(registry_dir: Path | None = None) -> list[str]:
    """Delete the namespaces that registry files of dead owners name; returns those removed.

    A network whose owner still runs (a campaign or a test in progress) is left alone.
    """
    directory = registry_dir or default_registry_dir()
    removed: list[str] = []
    if not directory.is_dir():
        return removed
    existing = list_namespaces()
    for entry in sorted(directory.glob("*.json")):
        try:
            recorded = json.loads(entry.read_text())
            names = recorded["namespaces"]
        except (OSError, ValueError, KeyError) as e:
            raise NetnsError(f"unreadable registry file {entry}: {e}; remove it by hand") from e
        if owner_alive(recorded):
            continue
        for ns in names:
            if ns in existing and ns.startswith(PREFIX):
                _run(["ip", "netns", "del", ns])
                removed.append(ns)
        entry.unlink()
    return removed
