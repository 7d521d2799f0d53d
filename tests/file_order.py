"""The suite's files in the order that finishes soonest on a few workers: the longest first.

``make test`` hands each pytest-xdist worker whole files (``--dist loadfile``), in collection order,
a new one whenever a worker is free. Collected alphabetically, a 2-minute file that comes last
leaves the other worker idle for its whole length; longest first (the classic LPT rule) ends the
workers within about one short file of each other. The cost of each file is what it took on the last
measured run (``tests/file_costs.json``, seconds summed over its setup, calls and teardown);
a file it does not name counts as the median. Within a file the order is untouched.

``pytest --store-file-costs`` (a whole run: ``make test PYTEST_ARGS=--store-file-costs``) writes the
costs it measured back to that file.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

COSTS = Path(__file__).with_name("file_costs.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-file-costs", action="store_true",
                     help=f"write each test file's measured seconds to {COSTS.name} (the order of later runs)")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    costs = json.loads(COSTS.read_text()) if COSTS.is_file() else {}
    default = statistics.median(costs.values()) if costs else 0.0
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-costs.get(_file(item.nodeid), default), _file(item.nodeid), position[id(item)]))


class _Recorder:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_file(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.seconds:
            return  # the controller writes, from every worker's reports
        costs = {name: round(seconds, 1) for name, seconds in sorted(self.seconds.items())}
        COSTS.write_text(json.dumps(costs, indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--store-file-costs"):
        config.pluginmanager.register(_Recorder(), "file-costs-recorder")
