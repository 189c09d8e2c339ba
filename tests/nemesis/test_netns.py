"""Real network namespaces: links work, partitions drop packets, the host is untouched."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkref.nemesis.netns import (
    NamespaceNetwork,
    cleanup_leftovers,
    list_namespaces,
    namespaces_supported,
)
from bkref.nemesis.partition import isolate

SUPPORTED, WHY = namespaces_supported()
pytestmark = pytest.mark.skipif(not SUPPORTED, reason=f"no network namespaces here: {WHY}")

SERVER = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 7000)); s.listen()
    print("listening", flush=True)
    while True:
        c, _ = s.accept(); c.sendall(c.recv(64)); c.close()
    """
)
CLIENT = textwrap.dedent(
    """
    import socket, sys
    try:
        with socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2])) as c:
            c.sendall(b"ping"); print(c.recv(64).decode())
    except OSError as e:
        print("unreachable", type(e).__name__)
    """
)


def _host_network() -> str:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    # Counters change with traffic; compare the rules, not the counts.
    rules = "\n".join(line for line in rules.splitlines() if not line.startswith(("#", ":")))
    return links + rules


@pytest.fixture
def network(tmp_path: Path) -> Iterator[NamespaceNetwork]:
    net = NamespaceNetwork(["a", "b", "c"], registry_dir=tmp_path / "registry")
    try:
        net.setup()
        yield net
    finally:
        net.teardown()


# Seconds a ping waits for its echo. A partition drops packets, so a ping it cuts waits
# the whole time: short where the ping must fail, generous where it must get through (a
# loaded machine may not run the echo server within a second).
CUT, THROUGH = 1.0, 30.0


def _ping(net: NamespaceNetwork, src: str, dst: str, timeout: float = THROUGH) -> str:
    argv = net.exec_argv(src, [sys.executable, "-c", CLIENT, net.nodes[dst].ip, str(timeout)])
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def test_partition_drops_packets_and_heal_restores_them(network: NamespaceNetwork) -> None:
    server = subprocess.Popen(
        network.exec_argv("a", [sys.executable, "-c", SERVER, network.nodes["a"].ip]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "listening"
        assert _ping(network, "b", "a") == "ping"
        assert _ping(network, "c", "a") == "ping"

        network.apply_grudge(isolate(list(network.nodes), "a"))
        assert _ping(network, "b", "a", CUT).startswith("unreachable")
        assert _ping(network, "c", "a", CUT).startswith("unreachable")

        network.heal()
        assert _ping(network, "b", "a") == "ping"
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


def test_setup_and_teardown_leave_the_host_network_unchanged(tmp_path: Path) -> None:
    before = _host_network()
    net = NamespaceNetwork(["x", "y"], registry_dir=tmp_path)
    net.setup()
    try:
        net.apply_grudge(isolate(["x", "y"], "x"))
        assert _host_network() == before
        assert {n.netns for n in net.nodes.values()} <= list_namespaces()
    finally:
        net.teardown()
    assert _host_network() == before
    assert not ({n.netns for n in net.nodes.values()} | {net.bridge_ns}) & list_namespaces()


def test_cleanup_removes_what_an_interrupted_run_left(tmp_path: Path) -> None:
    net = NamespaceNetwork(["p", "q"], registry_dir=tmp_path)
    net.setup()  # and then the runner "crashes": no teardown
    assert cleanup_leftovers(tmp_path) == []  # while its owner (this test) runs, it stays
    recorded = json.loads(net.registry.read_text())
    recorded["owner"] = {"pid": 2**22 + 1, "start": 0}  # above pid_max: a dead owner
    net.registry.write_text(json.dumps(recorded))
    removed = cleanup_leftovers(tmp_path)
    assert sorted(removed) == sorted([net.nodes["p"].netns, net.nodes["q"].netns, net.bridge_ns])
    assert not set(removed) & list_namespaces()
    assert list(tmp_path.glob("*.json")) == []
