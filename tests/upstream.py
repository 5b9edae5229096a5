"""A local upstream for the fetch tests: files with an ETag and Last-Modified, and checksum
lists of them (``/sums/<algo>sums``), served on 127.0.0.1 by a thread."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Upstream:
    """What the test server serves; tests change it between requests."""

    base: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    etag: bool = True
    modified: dict[str, str] = field(default_factory=dict)
    truncate: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)

    def sums(self, algo: str) -> bytes:
        return "".join(f"{hashlib.new(algo, body).hexdigest()}  {Path(name).name}\n"
                       for name, body in self.files.items()).encode()


@contextlib.contextmanager
def serve() -> Iterator[Upstream]:
    """Serve an :class:`Upstream` on 127.0.0.1 (a thread), stopped on exit."""
    state = Upstream()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet test output
            pass

        def _body(self) -> bytes | None:
            state.requests.append(f"{self.command} {self.path}")
            if self.path.startswith("/sums/"):
                return state.sums(self.path.rsplit("/", 1)[1].removesuffix("sums"))
            return state.files.get(self.path)

        def _send(self, head: bool) -> None:
            body = self._body()
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            if state.etag:
                self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()[:12]}"')
            if self.path in state.modified:
                self.send_header("Last-Modified", state.modified[self.path])
            self.end_headers()
            if not head:
                self.wfile.write(body[: len(body) // 2] if self.path in state.truncate else body)

        def do_HEAD(self) -> None:  # noqa: N802
            self._send(head=True)

        def do_GET(self) -> None:  # noqa: N802
            self._send(head=False)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    state.base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
