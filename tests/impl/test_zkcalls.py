"""The client's ZooKeeper calls: kazoo's errors become the client's, with kazoo's as cause.

Run against a stand-in for kazoo that is connected; the calls themselves raise what
kazoo or the metadata store would. (tests/impl/test_zookeeper_loss.py does the same
against a real ZooKeeper that goes away.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from kazoo.exceptions import (
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NoNodeError,
    SessionExpiredError,
)

from bkref.impl.client.errors import BKError, ZooKeeperError
from bkref.impl.client.zkcalls import ZkCalls
from bkref.impl.core.digest import DigestType, password_hash
from bkref.impl.core.metadata import LedgerMetadata, Segment
from bkref.impl.meta.store import (
    MetadataConflictError,
    MetadataUnavailableError,
    NoSuchLedgerError,
    ZkMetadataStore,
)

HOSTS = "zk1:2181,zk2:2181"


class _ConnectedZk:
    connected = True


def _calls(call_timeout: float = 5.0) -> ZkCalls:
    calls = ZkCalls(HOSTS, call_timeout=call_timeout)
    calls._store = ZkMetadataStore(cast(Any, _ConnectedZk()))
    return calls


def _raises(e: BaseException) -> Callable[[], None]:
    def fn() -> None:
        raise e

    return fn


def _call(calls: ZkCalls, fn: Callable[[], object], *, writes: bool = False) -> object:
    return asyncio.run(calls.call("list ledgers", fn, writes=writes))


def test_zookeeper_unreachable_is_a_zookeeper_error_with_kazoos_error_as_cause() -> None:
    lost = ConnectionLoss()
    with pytest.raises(ZooKeeperError) as caught:
        _call(_calls(), _raises(lost))
    err = caught.value
    assert not isinstance(err, KazooException)
    assert isinstance(err, BKError)
    assert err.__cause__ is lost
    assert str(err) == (
        f"list ledgers: ZooKeeper at {HOSTS} failed (ConnectionLoss); retry once ZooKeeper answers"
    )


def test_a_write_whose_outcome_is_unknown_says_to_read_before_retrying() -> None:
    with pytest.raises(ZooKeeperError, match="may or may not have happened") as caught:
        _call(_calls(), _raises(SessionExpiredError()), writes=True)
    assert isinstance(caught.value.__cause__, SessionExpiredError)


def test_a_call_zookeeper_refuses_is_a_zookeeper_error_that_says_what_to_check() -> None:
    for refusal in (NoNodeError("/ledgers"), NoAuthError()):
        with pytest.raises(ZooKeeperError) as caught:
            _call(_calls(), _raises(refusal))
        assert caught.value.__cause__ is refusal
        assert f"refused it ({type(refusal).__name__}" in str(caught.value)
        assert "check that a cluster is set up under /ledgers" in str(caught.value)


def test_a_call_zookeeper_does_not_answer_in_time_is_a_zookeeper_error() -> None:
    with pytest.raises(ZooKeeperError, match=r"did not answer in 0\.2 s") as caught:
        _call(_calls(call_timeout=0.2), lambda: time.sleep(1.0))
    assert isinstance(caught.value.__cause__, TimeoutError)


def test_a_cas_the_store_gave_up_on_is_a_zookeeper_error() -> None:
    gave_up = MetadataUnavailableError("ZooKeeper unreachable for 30 s while updating ledger 3")
    with pytest.raises(ZooKeeperError, match=r"^list ledgers: ZooKeeper unreachable") as caught:
        _call(_calls(), _raises(gave_up), writes=True)
    assert caught.value.__cause__ is gave_up


def test_the_stores_own_answers_pass_through_for_the_driver() -> None:
    md = LedgerMetadata(1, 1, 1, (Segment(0, ("b0",)),), DigestType.CRC32C, password_hash(b""))
    for answer in (NoSuchLedgerError(3), MetadataConflictError(3, md, 4)):
        with pytest.raises(type(answer)) as caught:
            _call(_calls(), _raises(answer))
        assert caught.value is answer
