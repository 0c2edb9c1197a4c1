"""Where the bytes of a file come from: an HTTP(S) server with Range, or a mounted folder.

A source streams one file from an offset. It raises `TransientError` for what a retry
may cure (connection dropped, timeout, 5xx, 429) and `DownloadFailed` for what it won't.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

import httpx

from meshnet import __version__
from meshnet.api.modelartifact import ArtifactFile, ArtifactSource
from meshnet.errors import ArtifactSpecError, DownloadFailed

READ_BYTES = 1 << 20
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}


class TransientError(Exception):
    """A failure worth retrying after a backoff."""


class ByteSource(Protocol):
    def stream(self, file: ArtifactFile, offset: int) -> Generator[bytes, None, None]:
        """The file's bytes from `offset` to its end (fewer if the transfer breaks)."""
        ...


class HttpSource:
    def __init__(self, base_url: str | None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/") + "/" if base_url else None
        self.client = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=10.0),
            follow_redirects=True,
            headers={"User-Agent": f"meshnet/{__version__}", "Accept-Encoding": "identity"},
        )

    def close(self) -> None:
        self.client.close()

    def url(self, file: ArtifactFile) -> str:
        if file.url:
            return file.url
        if not self.base_url:
            raise ArtifactSpecError(f"{file.name} has no url and the source has no http.baseURL")
        return self.base_url + quote(file.name)

    def stream(self, file: ArtifactFile, offset: int) -> Generator[bytes, None, None]:
        url = self.url(file)
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        try:
            with self.client.stream("GET", url, headers=headers) as response:
                skip = self._check_response(response, url, file, offset)
                if skip is None:
                    return
                for block in response.iter_raw(READ_BYTES):
                    if skip:
                        # The server ignored Range: drop what we already have.
                        dropped = min(skip, len(block))
                        block, skip = block[dropped:], skip - dropped
                    if block:
                        yield block
        except httpx.TransportError as exc:
            raise TransientError(f"{url}: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _check_response(
        response: httpx.Response, url: str, file: ArtifactFile, offset: int
    ) -> int | None:
        """Bytes to skip at the start of the body, or None when nothing is left to fetch."""
        status = response.status_code
        if status == 206:
            match = _CONTENT_RANGE.match(response.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != offset:
                raise TransientError(f"{url}: answered a different range than bytes={offset}-")
            return 0
        if status == 200:
            return offset
        if status == 416 and offset >= file.size:
            return None
        if status in _RETRYABLE_STATUS:
            raise TransientError(f"{url}: HTTP {status}")
        raise DownloadFailed(f"{file.name}: {url} answered HTTP {status} {response.reason_phrase}")


class DirectorySource:
    """Files already on a mounted volume (a source PVC or host path)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def close(self) -> None:
        pass

    def stream(self, file: ArtifactFile, offset: int) -> Generator[bytes, None, None]:
        try:
            with open(self.root / file.name, "rb") as handle:
                size = handle.seek(0, 2)
                if size != file.size:
                    raise DownloadFailed(
                        f"{file.name}: {size:,} bytes in {self.root}, "
                        f"the manifest says {file.size:,}"
                    )
                handle.seek(offset)
                while block := handle.read(READ_BYTES):
                    yield block
        except FileNotFoundError:
            raise DownloadFailed(f"{file.name}: not found in source folder {self.root}") from None
        except OSError as exc:
            raise TransientError(f"{self.root / file.name}: {exc.strerror}") from exc


@contextmanager
def open_source(
    source: ArtifactSource | None, source_dir: Path | None = None
) -> Iterator[HttpSource | DirectorySource]:
    """The byte source for a spec's `source` (None: only `source_dir` or per-file urls).

    `source_dir` is where the source volume is mounted in this container: required for
    a PVC (its subPath is applied inside it), optional for a host path (default: the path).
    """
    chosen: HttpSource | DirectorySource
    source = source or ArtifactSource()
    if source.pvc is not None:
        if source_dir is None:
            raise ArtifactSpecError(
                f"source PVC {source.pvc.claim_name}: pass --source-dir where it is mounted"
            )
        chosen = DirectorySource(source_dir / source.pvc.sub_path)
    elif source.host_path is not None:
        chosen = DirectorySource(source_dir or Path(source.host_path.path))
    elif source_dir is not None:
        chosen = DirectorySource(source_dir)
    else:
        # Files may each carry their own url, so a missing baseURL is checked per file.
        chosen = HttpSource(source.http.base_url if source.http else None)
    try:
        yield chosen
    finally:
        chosen.close()
