"""Registration in ZooKeeper, acting on kazoo's connection states as kazoo documents them.

- CONNECTED: registered (again, after a LOST session: the ephemeral znode died
  with the old session and must be re-created).
- SUSPENDED: the session may still be alive; nothing is assumed lost, the
  bookie keeps serving (its data does not depend on the session).
- LOST: the session expired and the ephemeral znode is gone; kazoo reconnects
  with a new session, and the next CONNECTED re-registers.

Listeners run on kazoo's thread and must not block, so work goes to a thread.
"""

from __future__ import annotations

import logging
import threading
import time

from kazoo.client import KazooState
from kazoo.exceptions import KazooException

from bkref.impl.meta.store import ZkMetadataStore
from bkref.impl.trace import REGISTERED, Tracer

log = logging.getLogger(__name__)


class Registration:
    def __init__(
        self, store: ZkMetadataStore, bookie_id: str, rack: str, tracer: Tracer | None = None
    ) -> None:
        self.store = store
        # Each registration is a trace line: the auditor's "lost" ends here (trace validation).
        self.tracer = tracer
        self.bookie_id = bookie_id
        self.rack = rack
        self.readonly = False
        self._lost = False
        self._lock = threading.Lock()
        self.registrations = 0
        store.zk.add_listener(self._on_state)

    def register(self, readonly: bool | None = None) -> None:
        with self._lock:
            if readonly is not None:
                self.readonly = readonly
            deadline = time.monotonic() + 60
            while True:
                try:
                    self.store.register(self.bookie_id, rack=self.rack, readonly=self.readonly)
                    self.registrations += 1
                    if self.tracer is not None:
                        self.tracer.step(REGISTERED, bookie=self.bookie_id)
                    log.info(
                        "registered %s as %s",
                        self.bookie_id,
                        "read-only" if self.readonly else "writable",
                    )
                    return
                except (RuntimeError, KazooException) as e:
                    # An old session's znode lingers until that session expires.
                    if time.monotonic() > deadline:
                        raise
                    log.warning("registration of %s failed (%s); retrying", self.bookie_id, e)
                    time.sleep(0.5)

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._lost = True
            log.warning(
                "ZooKeeper session lost: registration of %s is gone until reconnect", self.bookie_id
            )
        elif state == KazooState.SUSPENDED:
            log.warning(
                "ZooKeeper connection suspended; still serving, registration may "
                "lapse if the session expires"
            )
        elif state == KazooState.CONNECTED and self._lost:
            self._lost = False
            threading.Thread(target=self._reregister, name="reregister", daemon=True).start()

    def _reregister(self) -> None:
        try:
            self.register()
        except Exception:
            log.exception("re-registration of %s after session loss failed", self.bookie_id)
