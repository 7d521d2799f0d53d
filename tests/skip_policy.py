"""Pytest plugin: only a test that needs a CUDA device may skip; any other skip fails the session.

A skipped test checks nothing, so a suite that goes green with tests skipped (a missing data file,
a missing dependency, a platform check) hides what those tests are there to catch. Tests marked
``cuda`` skip on machines without one (``make bench-gpu`` runs them on a GPU); every other skip, at
collection or at run time, turns the exit status into a failure and is listed in one line at the
end of the run."""
from __future__ import annotations

import pytest

__all__ = ["CUDA_MARK", "SkipPolicy"]

#: the marker of the tests that may skip: those that need a CUDA device
CUDA_MARK = "cuda"


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class SkipPolicy:
    """Records the skips of tests without the ``cuda`` mark and fails the session on any."""

    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []  # (test or module, reason)

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        # in the JUnit report (<property name="needs" value="cuda"/>): make bench-gpu counts these
        if item.get_closest_marker(CUDA_MARK):
            item.user_properties.append(("needs", CUDA_MARK))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a module-level skip or importorskip: none of its tests ran
            self.skipped.append((report.nodeid, _reason(report)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail") and CUDA_MARK not in report.keywords:
            self.skipped.append((report.nodeid, _reason(report)))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.skipped and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.skipped:
            listed = "; ".join(f"{node} ({reason})" for node, reason in self.skipped)
            terminalreporter.write_line(
                f"error: {len(self.skipped)} test(s) skipped without the '{CUDA_MARK}' mark, and only tests that "
                f"need a CUDA device may skip: {listed}. Install what they need (`make test` installs the test "
                f"extra and its data), or mark the test '{CUDA_MARK}' if it needs a GPU.", red=True, bold=True)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipPolicy(), "skip_policy_checks")
