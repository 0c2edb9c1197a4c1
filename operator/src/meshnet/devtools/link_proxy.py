"""A user-space TCP proxy that makes a loopback connection behave like a network leg
(`link_model.Link`: delay, bandwidth, jitter, loss as TCP feels it), in each direction,
order kept and no byte dropped: a WAN between processes on one machine (there is no kernel
netem here). The link can change while it runs."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from dataclasses import replace

from meshnet.devtools.link_model import Direction, Link

MAX_QUEUE_S = 0.1  # a sender's socket buffer: reading stops while this much waits to leave
READ_BYTES = 1 << 16


class LinkProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port` over `link`. The target may
    be set later (a proxy's own port is known first, so a process can be started pointing
    at it); until then connections are closed."""

    def __init__(self, target_port: int | None = None, link: Link | None = None,
                 seed: int | None = None) -> None:
        self.target_port = target_port
        self.link = link or Link()
        self._rng = random.Random(seed)  # jitter and loss draws: a seed repeats them
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="link-proxy")
        self._thread.start()
        if not self._ready.wait(10) or self._server is None:
            raise RuntimeError("the link proxy did not start")
        self.port: int = int(self._server.sockets[0].getsockname()[1])

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def delay(self) -> float:
        return self.link.delay_s

    @delay.setter
    def delay(self, seconds: float) -> None:
        self.link = replace(self.link, delay_s=seconds)

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
        direction = Direction(self.link, self._rng)

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
        while data := await reader.read(READ_BYTES):
            direction.link = self.link  # changes apply to the bytes sent after them
            now = time.monotonic()
            queue.put_nowait((direction.arrival(now, len(data)), data))
            # A full send buffer stops the sender, as TCP's flow control does.
            if (waiting := direction.queued_s(now) - MAX_QUEUE_S) > 0:
                await asyncio.sleep(waiting)
        queue.put_nowait((0.0, b""))
        await sender

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
