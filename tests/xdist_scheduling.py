"""How `make verify` spreads the suite over pytest-xdist's workers (``--dist loadfile``).

Two changes to pytest-xdist 3.8.0's ``LoadFileScheduling`` (the newest release):

- **A crashed worker costs only the test it crashed on.** A worker crashes when a test
  ends its process, and on purpose when a Spark test runs out of time
  (tests/spark_checks/conftest.py). xdist's ``LoadScopeScheduling.remove_node`` puts the
  dead worker's whole workload back on the queue, and three things follow:
  - the test it crashed on, already reported failed, runs again on the replacement
    worker, crashing it too until ``--max-worker-restart`` is spent; the rest of its
    module never runs (pytest-dev/pytest-xdist PR 1371, open);
  - the modules it had finished come back as empty work units, and a worker sent one
    has nothing to run. Enough of them at the end of a run leave every worker waiting
    for work that never comes (issue 1378, open);
  - a replacement worker sent a single test never runs it: a worker runs a test only
    once it holds the next one or the order to shut down, and neither is sent
    (issue 1327, fixed by PR 1328 after 3.8.0).

  Here the crashed test is marked done (xdist has reported it failed), finished
  modules stay finished, and a worker is topped up to two tests or shut down.
- **The Spark session's modules are one unit**, on one worker (``SparkTogether``).
"""

from __future__ import annotations

from typing import Final

from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]
from xdist.workermanage import WorkerController  # type: ignore[import-untyped]

# The Spark tests that share the worker's one Spark session (tests/spark_checks/conftest.py:
# starting one costs about 20 CPU s): `--dist loadfile` would spread their modules over the
# workers, each starting a JVM of its own. The standalone cluster's tests start JVMs of
# their own and run apart.
SPARK_SESSION_SCOPE: Final = "tests/spark_checks (one Spark session)"
OWN_JVMS: Final = frozenset({"tests/spark_checks/test_cluster.py"})


class CrashSafeLoadFile(LoadFileScheduling):  # type: ignore[misc]
    """``--dist loadfile`` in which a worker's crash fails one test, never a module."""

    def remove_node(self, node: WorkerController) -> str | None:
        """Forget ``node``; if it died mid-work, return the test it died on, marked done,
        and queue again only the units it had not finished."""
        workload: dict[str, dict[str, bool]] = self.assigned_work.pop(node)
        pending = (
            nodeid for unit in workload.values() for nodeid, done in unit.items() if not done
        )
        crashitem = next(pending, None)
        if crashitem is None:
            return None  # a clean shutdown
        for unit in workload.values():
            if crashitem in unit:
                unit[crashitem] = True  # reported failed by xdist; run again, it would crash again
        for scope, work in workload.items():
            if not all(work.values()):
                self.workqueue[scope] = work
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node: WorkerController) -> None:
        """xdist's rule (more work once two tests or fewer are left), then at least two
        tests or the order to shut down, so the worker can always run its next test."""
        if node.shutting_down:
            return
        if self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
            self._assign_work_unit(node)
            while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
                self._assign_work_unit(node)
        if not self.workqueue:
            node.shutdown()


class SparkTogether(CrashSafeLoadFile):
    """The Spark session's modules as one scope; every other module a scope of its own."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        if path.startswith("tests/spark_checks/") and path not in OWN_JVMS:
            return SPARK_SESSION_SCOPE
        return str(super()._split_scope(nodeid))
