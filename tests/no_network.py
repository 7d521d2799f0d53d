"""Pytest plugin: the tests run offline, in this process and in every process they start.

What a test needs from a package registry, ``make test`` installs or downloads before the tests
run; a test that reaches for the network itself (a ``pip download``, a weights or data set
download through urllib or requests) must fail here, not pass on a machine that happens to be
online. Every HTTP(S) client honours the proxy variables, so they point at a local port nothing
listens on (the request is refused at once), loopback stays direct for the multi-process tests and
W&B's local service, and pip is told to use no index."""
from __future__ import annotations

import os

import pytest

__all__ = ["OFFLINE_ENVIRONMENT", "UNREACHABLE_PROXY"]

#: the discard port on this machine: nothing serves it, so a connection is refused at once
UNREACHABLE_PROXY = "http://127.0.0.1:9"
LOOPBACK = "localhost,127.0.0.1,::1"

OFFLINE_ENVIRONMENT = {
    **{name: UNREACHABLE_PROXY for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                                            "http_proxy", "https_proxy", "all_proxy")},
    "NO_PROXY": LOOPBACK, "no_proxy": LOOPBACK,
    "PIP_NO_INDEX": "1",
}


def pytest_configure(config: pytest.Config) -> None:
    os.environ.update(OFFLINE_ENVIRONMENT)
