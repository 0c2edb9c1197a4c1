"""A loopback Tracker for tests and demos: a real HTTP server on 127.0.0.1 that records
every report POSTed to it, checks the bearer token, and can be told to fail or go down.
(The real Tracker is external to this project; this stands in for it.)"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any  # the parsed JSON (None when it was not JSON)
    status: int  # what the receiver answered


@dataclass
class LoopbackTracker:
    """`url` accepts reports while running; `received` holds every request, answered or not."""

    token: str | None = None
    port: int = 0  # 0: any free port (fixed once started, so a restart keeps the URL)
    path: str = "/v1/reports"
    received: list[Received] = field(default_factory=list)
    _failures: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> LoopbackTracker:
        tracker = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                status, extra = tracker._answer(self.path, self.headers.get("Authorization"))
                with tracker._lock:
                    tracker.received.append(Received(self.path, dict(self.headers), body, status))
                self.send_response(status)
                for key, value in extra.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *_: Any) -> None:  # quiet: tests read `received`
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Down: connections to the port are refused until `start` again."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def fail_next(self, count: int, status: int = 503, headers: dict[str, str] | None = None
                  ) -> None:
        """Answer the next `count` reports with `status` (e.g. 503, 429 with Retry-After)."""
        with self._lock:
            self._failures.extend([(status, dict(headers or {}))] * count)

    def _answer(self, path: str, authorization: str | None) -> tuple[int, dict[str, str]]:
        if path != self.path:
            return 404, {}
        if self.token is not None and authorization != f"Bearer {self.token}":
            return 401, {}
        with self._lock:
            if self._failures:
                return self._failures.pop(0)
        return 202, {}

    def accepted(self) -> list[Any]:
        """Bodies of the reports it accepted, in arrival order."""
        with self._lock:
            return [r.body for r in self.received if 200 <= r.status < 300]

    def wait_for(self, check: Callable[[list[Any]], bool], timeout: float = 60.0,
                 what: str = "reports") -> list[Any]:
        """Poll the accepted reports until `check` holds (AssertionError after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            reports = self.accepted()
            if check(reports):
                return reports
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what};"
                                     f" received {len(self.received)} requests")
            time.sleep(0.05)

    def __enter__(self) -> LoopbackTracker:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
