"""Network legs per token (docs/architecture.md): decode tokens/s of a 2-stage SmolLM2 route
with a user-space delay proxy adding --delay-ms one way on every connection (driver to
each stage, stage to stage), for the hub, the chain stepped by the driver, and the chain
with the first stage's decode loop.

    .venv/bin/python bench/latency_bench.py [--bin-dir DIR] [--delay-ms 10] [--tokens 32]

Expected legs per token for S stages: hub 2S, chain stepped by the driver 2S (but only
two of them touch the driver), decode loop 2(S-1).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from meshnet.bundled import smollm2_gguf
from meshnet.route import RouteDriver
from meshnet.route.launch import WorkerSpec, free_port, start_route, worker_binary


class DelayProxy:
    """Forwards 127.0.0.1:listen_port to 127.0.0.1:target_port, holding every chunk of
    bytes `delay` seconds in each direction (order kept, bandwidth untouched)."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port = target_port
        self.delay = delay
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                     ) -> None:
        try:
            target_r, target_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.close()
            return
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


@contextmanager
def delayed_route(binary: Path, model: Path, delay: float, chain: bool,
                  ) -> Iterator[list[str]]:
    """Two stages (0:15, 15:30) behind proxies; with `chain`, stage 0 relays to stage 1
    through a proxy too. Yields the driver's endpoints (the proxies)."""
    ports = [free_port(), free_port()]
    proxies = [DelayProxy(port, delay) for port in ports]
    link = DelayProxy(ports[1], delay) if chain else None
    specs = [
        WorkerSpec(model=model, layers=(0, 15), threads=1, listen=f"127.0.0.1:{ports[0]}",
                   next_stage=f"127.0.0.1:{link.port}" if link else ""),
        WorkerSpec(model=model, layers=(15, 30), threads=1, listen=f"127.0.0.1:{ports[1]}"),
    ]
    workers = start_route(binary, specs, Path(tempfile.mkdtemp(prefix="meshnet-latency-")))
    try:
        yield [f"127.0.0.1:{proxy.port}" for proxy in proxies]
    finally:
        for worker in workers:
            worker.stop()
        for proxy in [*proxies, *([link] if link else [])]:
            proxy.stop()


def decode_rate(endpoints: list[str], tokens: int, topology: str, loop: bool) -> float:
    with RouteDriver(endpoints, topology=topology, decode_loop=loop) as driver:
        driver.connect(wait=30)
        driver.generate([1, 2, 3], max_tokens=4, stop_at_eos=False)  # warm up the channels
        generation = driver.generate("The history of printing", max_tokens=tokens,
                                     stop_at_eos=False)
        return generation.decode_tokens_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", type=Path, default=None)
    parser.add_argument("--delay-ms", type=float, default=10.0, help="One way, per leg.")
    parser.add_argument("--tokens", type=int, default=32)
    options = parser.parse_args()
    binary = options.bin_dir / "meshnet-shard-worker" if options.bin_dir else worker_binary()
    model = smollm2_gguf()
    delay = options.delay_ms / 1000.0
    rows = []
    with delayed_route(binary, model, delay, chain=False) as endpoints:
        rows.append(("hub (driver calls each stage)", 4,
                     decode_rate(endpoints, options.tokens, "hub", loop=False)))
    with delayed_route(binary, model, delay, chain=True) as endpoints:
        rows.append(("chain, stepped by the driver", 4,
                     decode_rate(endpoints, options.tokens, "chain", loop=False)))
        rows.append(("chain + first-stage decode loop", 2,
                     decode_rate(endpoints, options.tokens, "chain", loop=True)))
    print(f"SmolLM2-135M Q4_1, 2 stages (1 thread each), {options.delay_ms:g} ms one way per "
          f"leg, {options.tokens} tokens, load average {os.getloadavg()[0]:.2f}")
    print(f"{'topology':<34}{'legs/token':>11}{'decode tok/s':>14}{'ms/token':>10}")
    for label, legs, rate in rows:
        print(f"{label:<34}{legs:>11}{rate:>14.1f}{1000 / rate:>10.1f}")


if __name__ == "__main__":
    main()
