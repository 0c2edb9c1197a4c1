"""A user-space TCP proxy that holds every chunk of bytes for a one-way delay, in each
direction, order kept and bandwidth untouched: a WAN leg between processes on one
machine (there is no kernel netem here). The delay can change while it runs."""

from __future__ import annotations

import asyncio
import socket
import threading
import time


class DelayProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port`, `delay` seconds one way. The
    target may be set later (a proxy's own port is known first, so a process can be
    started pointing at it); until then connections are closed."""

    def __init__(self, target_port: int | None = None, delay: float = 0.0) -> None:
        self.target_port = target_port
        self.delay = delay
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="delay-proxy")
        self._thread.start()
        if not self._ready.wait(10) or self._server is None:
            raise RuntimeError("the delay proxy did not start")
        self.port: int = int(self._server.sockets[0].getsockname()[1])

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0))
        self._ready.set()
        self._loop.run_forever()
        self._server.close()
        # Connections still open end here, quietly, before the loop closes.
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.close()

    async def _serve(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        if self.target_port is None:
            client_w.close()
            return
        try:
            target_r, target_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
        for writer in (client_w, target_w):  # a leg's latency, not Nagle's
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self._pipe(client_r, target_w), self._pipe(target_r, client_w),
                             return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.create_task(deliver())
        while data := await reader.read(1 << 16):
            queue.put_nowait((time.monotonic() + self.delay, data))
        queue.put_nowait((0.0, b""))
        await sender

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
