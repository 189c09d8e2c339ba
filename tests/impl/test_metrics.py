"""A bookie's /metrics and admin API: BookKeeper's series names and paths, served by a
real bookie process (with its AutoRecovery node) on a real ZooKeeper; and the server's
answers to each path, without a process."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bkref.impl.bookie.config import BookieConfig, ConfigError
from bkref.impl.client.client import BookKeeper
from bkref.impl.core.repair import Reason
from bkref.impl.metrics import NO_UR_LEDGERS, AdminState, BookieMetrics, MetricsServer
from bkref.impl.testing import eventually, write_closed_ledgers
from tests.impl.autorecovery_helpers import FAST, PW
from tests.impl.conftest import MakeCluster, ZkView


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_server_answers_each_path_and_refuses_others(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = BookieMetrics(registry)
    metrics.request("add", 0.004, ok=True)
    metrics.request("read", 0.002, ok=False)
    metrics.journal_commit(0.001, [0.003, 0.005])
    marked: list[int] = []
    state = AdminState(str(tmp_path), read_only=lambda: True, under_replicated=lambda: marked)
    server = MetricsServer(0, registry, state).start()
    try:
        port = server.port
        code, text = _get(port, "/metrics")
        assert code == 200
        s = _samples(text)
        assert s[("bookkeeper_server_ADD_ENTRY_count", (("success", "true"),))] == 1
        assert s[("bookkeeper_server_ADD_ENTRY_sum", (("success", "true"),))] == 4.0  # ms
        assert s[("bookkeeper_server_READ_ENTRY_count", (("success", "false"),))] == 1
        assert s[("bookie_journal_JOURNAL_SYNC_count", ())] == 1
        assert s[("bookie_journal_JOURNAL_ADD_ENTRY_count", ())] == 2
        assert not any(name.endswith("_created") for name, _ in s)
        assert _get(port, "/heartbeat") == (200, "OK\n")
        code, info = _get(port, "/api/v1/bookie/info")
        sizes = json.loads(info)
        assert code == 200
        assert 0 <= sizes["freeSpace"] <= sizes["totalSpace"]
        code, st = _get(port, "/api/v1/bookie/state")
        assert (code, json.loads(st)["readOnly"], json.loads(st)["running"]) == (200, True, True)
        path = "/api/v1/autorecovery/list_under_replicated_ledger"
        assert _get(port, path) == (404, NO_UR_LEDGERS)
        marked += [9, 4]
        assert _get(port, path) == (200, "[4, 9]")
        assert _get(port, "/api/v1/nothing")[0] == 404
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError, match="Connection refused"):  # closed: gone
        urllib.request.urlopen(f"http://127.0.0.1:{port}/heartbeat", timeout=2)


def test_a_dedicated_node_has_no_bookie_endpoints(tmp_path: Path) -> None:
    server = MetricsServer(0, CollectorRegistry(), AdminState(None)).start()
    try:
        assert _get(server.port, "/api/v1/bookie/info") == (404, "no bookie runs in this process\n")
        assert _get(server.port, "/heartbeat") == (200, "OK\n")
    finally:
        server.close()


def test_the_http_port_must_be_a_port() -> None:
    with pytest.raises(ConfigError, match="httpServerPort must be a port from 1 to 65535"):
        BookieConfig.from_dict({"httpServerPort": 70000})
    assert BookieConfig().httpServerEnabled is False  # off unless asked for


@pytest.mark.zookeeper
@pytest.mark.slow
async def test_a_bookie_process_serves_bookkeeper_named_series_and_its_admin_api(
    make_cluster: MakeCluster, zk_view: ZkView
) -> None:
    cluster = make_cluster(3, autorecovery=True, metrics=True, **FAST)
    _store, urm = zk_view(cluster)
    async with BookKeeper(cluster.zk_hosts) as bk:
        await write_closed_ledgers(bk, 2, 20, PW)
    ports = [b.http_port for b in cluster.bookies]
    assert all(p is not None for p in ports)
    texts = [_get(p, "/metrics")[1] for p in ports if p is not None]
    adds = sum(
        _samples(t).get(("bookkeeper_server_ADD_ENTRY_count", (("success", "true"),)), 0)
        for t in texts
    )
    assert adds >= 2 * 20 * 2  # every add acknowledged by Wq = Aq = 2 bookies
    for t in texts:
        s = _samples(t)
        assert s[("bookie_journal_JOURNAL_SYNC_count", ())] > 0
        assert ("replication_worker_NUM_BYTES_WRITTEN", ()) in s
        assert ("auditor_NUM_UNDER_REPLICATED_LEDGERS_count", ()) in s

    port = ports[0]
    assert port is not None
    path = "/api/v1/autorecovery/list_under_replicated_ledger"
    assert _get(port, path) == (404, NO_UR_LEDGERS)
    urm.set_enabled(False)  # so that no worker repairs the mark before it is seen
    urm.mark(77, {cluster.bookies[1].bookie_id: Reason.LOST}, 1)

    def gauge_is_one() -> bool:
        s = _samples(_get(port, "/metrics")[1])
        return s.get(("bkref_under_replicated_ledgers", ())) == 1

    assert await eventually(gauge_is_one, 30, 0.5)
    assert _get(port, path) == (200, "[77]")
