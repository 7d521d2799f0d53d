"""The suite runs offline (tests/no_network.py): a download tried by a test, in its own process or in
one it starts, fails at once instead of reaching the network; loopback stays reachable."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest


def test_a_download_in_the_test_process_is_refused():
    with pytest.raises(urllib.error.URLError, match="refused"):
        urllib.request.urlopen("https://pypi.org/simple/imgaug/", timeout=30)


def test_pip_download_in_a_started_process_fails_without_an_index(tmp_path):
    """A `pip download` a test starts (here of the detection photo's wheel) fails, and quickly:
    `make test` fetches what the tests need before they run."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                           "imgaug==0.4.0", "-d", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and not list(tmp_path.iterdir())
    assert os.environ["PIP_NO_INDEX"] == "1"


def test_loopback_is_still_reachable():
    class Hello(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the handler's name is the HTTP method)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello")

        def log_message(self, *args):
            pass

    with HTTPServer(("127.0.0.1", 0), Hello) as server:
        thread = threading.Thread(target=server.handle_request)
        thread.start()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/", timeout=30) as answer:
            assert answer.read() == b"hello"
        thread.join(timeout=30)
