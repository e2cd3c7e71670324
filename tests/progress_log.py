"""A pytest plugin: each test's start and end, appended to the file ``$VERL_PIPE_TEST_PROGRESS`` as they happen.

A JUnit report is written once, at the end; a tier that is killed (or whose pytest dies) leaves none. This log is
there even then, and names the tests that had started and not finished: what a stopped tier was doing
(tests/report_tiers.py prints them). Under pytest-xdist the controller writes it, for every worker.

Lines: ``<unix time>\\tstart|end\\t<node id>``; `make test` appends ``<unix time>\\tstop\\t<exit status>`` once the
tier is over, however it ended.
"""

from __future__ import annotations

import os
import time

PROGRESS_ENV = "VERL_PIPE_TEST_PROGRESS"


class ProgressLog:
    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)  # line-buffered: each line reaches the file as it is written

    def _write(self, event: str, nodeid: str) -> None:
        self.file.write(f"{time.time():.1f}\t{event}\t{nodeid}\n")

    def pytest_runtest_logstart(self, nodeid, location):
        self._write("start", nodeid)

    def pytest_runtest_logfinish(self, nodeid, location):
        self._write("end", nodeid)

    def pytest_unconfigure(self, config):
        self.file.close()


def pytest_configure(config):
    # taken out of the environment: a pytest session a test starts (an inner session, in its own folder) must not
    # write into this one's log; an xdist worker's events reach the controller, which logs them
    path = os.environ.pop(PROGRESS_ENV, None)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(ProgressLog(os.path.abspath(path)), "verl_pipe_progress_log")


def unfinished(path: str) -> list[tuple[str, float]]:
    """The tests the log shows started and not ended, with how long each had run by the log's last line (the
    tier's stop line, where `make test` wrote one)."""
    started: dict[str, float] = {}
    last = 0.0
    with open(path, errors="replace") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3:
                continue  # a line cut short by a kill
            stamp, event, nodeid = float(parts[0]), parts[1], parts[2]
            last = max(last, stamp)
            if event == "start":
                started[nodeid] = stamp
            elif event == "end":
                started.pop(nodeid, None)
    return [(nodeid, last - stamp) for nodeid, stamp in started.items()]
