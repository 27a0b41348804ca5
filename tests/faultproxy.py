"""A fault-injecting TCP proxy, so cluster tests can cut, slow and heal links between nodes.

Theory of operation
-------------------
One proxy stands for one *directed* link A->B. Node A is configured with the proxy's
``address`` as its peer address for B, and the proxy forwards every connection it accepts
to B's real address. Connections in this cluster are opened by the sender, so the traffic
A sends to B (and B's replies on those connections) crosses this proxy while B->A has its
own proxy: faults can be injected in one direction only.

Each proxy runs its own asyncio event loop in a daemon thread. The test thread stays
synchronous: it switches the mode and reads the counters while the node processes talk
through the proxy. A mode switch is shipped to the loop and returns only once it is in
force, so a test can act on the fault right after the call.

Modes:

``heal()``
    Forward bytes both ways (the default).
``cut()``
    Reset every open connection, both sides at once, and reset new connections as soon as
    they are accepted: what the endpoints see when a host or a router goes away.
``blackhole()``
    Keep connections open but drop every byte, both ways, and forward nothing from new
    connections: a partition that TCP does not notice. The dropped bytes leave holes in
    the streams, so ``heal()`` (or ``delay()``) resets every connection it finds and the
    endpoints must reconnect.
``delay(ms)``
    Forward, but hold every chunk ``ms`` milliseconds before writing it, in order. The
    delay applies to each direction, so a request/response round trip takes twice ``ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
import threading
from asyncio.trsock import TransportSocket
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

CHUNK_BYTES = 64 * 1024
QUEUE_CHUNKS = 16  # bounded, so a slow reader pushes back on the sender as TCP would
CALL_TIMEOUT_S = 10.0

_Chunk = tuple[float, bytes]  # (loop time it may be written at, data; b"" is EOF)


class Mode(enum.Enum):
    FORWARD = "forward"
    CUT = "cut"
    BLACKHOLE = "blackhole"


def _parse_target(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"target must be 'host:port', not {target!r}")
    return host, int(port)


def _linger_zero(sock: socket.socket | TransportSocket) -> None:
    # With a zero linger, close() sends a RST rather than a clean FIN.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _reset_socket(sock: socket.socket) -> None:
    if sock.fileno() != -1:
        _linger_zero(sock)
    sock.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and not writer.transport.is_closing():
        _linger_zero(sock)
    writer.transport.abort()


async def _wait_closed(writer: asyncio.StreamWriter) -> None:
    # A transport lost to an error reports it here; we only want to know it is gone.
    with contextlib.suppress(Exception):
        await writer.wait_closed()


@dataclass
class _Link:
    """One connection through the proxy: the accepted socket and the stream writers that
    came to own it and its upstream twin (client first)."""

    client: socket.socket
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


class FaultProxy:
    """Forwards 127.0.0.1:<ephemeral> to ``target`` ("host:port"), with injectable faults."""

    def __init__(self, target: str) -> None:
        self._host, self._port = _parse_target(target)
        self._mode = Mode.FORWARD
        self._delay_s = 0.0
        self._bytes_forwarded = 0
        self._connections_accepted = 0
        self._links: dict[asyncio.Task[None], _Link] = {}
        self._listener: socket.socket | None = None
        self._address = ""
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"faultproxy->{target}",
                                        daemon=True)
        self._thread.start()
        try:
            self._call(self._start())
        except BaseException:
            self._stop_thread()
            raise

    # -- the test thread's side ------------------------------------------------------------

    @property
    def address(self) -> str:
        return self._address

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def bytes_forwarded(self) -> int:
        """Bytes written to either endpoint (both directions added up)."""
        return self._bytes_forwarded

    @property
    def connections_accepted(self) -> int:
        """Connections accepted, including those reset at once by ``cut()``."""
        return self._connections_accepted

    def heal(self) -> None:
        self._call(self._switch(Mode.FORWARD, 0.0))

    def cut(self) -> None:
        self._call(self._switch(Mode.CUT, 0.0))

    def blackhole(self) -> None:
        self._call(self._switch(Mode.BLACKHOLE, 0.0))

    def delay(self, ms: int) -> None:
        if ms < 0:
            raise ValueError(f"delay must be >= 0 ms, not {ms}")
        self._call(self._switch(Mode.FORWARD, ms / 1000))

    def close(self) -> None:
        """Stop listening, reset every connection and join the loop's thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._shutdown())
        finally:
            self._stop_thread()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def _call(self, coroutine: Coroutine[Any, Any, None]) -> None:
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("FaultProxy is driven from another thread, not its own loop")
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CALL_TIMEOUT_S)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
        finally:
            self._loop.close()

    def _stop_thread(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    # -- the loop's side -------------------------------------------------------------------

    async def _start(self) -> None:
        # Not asyncio.start_server: in 3.11 an accept still in flight when the server closes
        # trips an assertion and leaks its socket. Accepting by hand leaves no such window.
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self._address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._loop.add_reader(self._listener.fileno(), self._accept)

    async def _switch(self, mode: Mode, delay_s: float) -> None:
        # Blackholed streams lost bytes: forwarding again on them would hand the endpoints
        # a corrupt stream, so they are reset and the endpoints reconnect.
        lost_bytes = self._mode is Mode.BLACKHOLE and mode is Mode.FORWARD
        self._mode, self._delay_s = mode, delay_s
        if mode is Mode.CUT or lost_bytes:
            await self._drop_links()

    async def _shutdown(self) -> None:
        if self._listener is not None:
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
        await self._drop_links()

    async def _drop_links(self) -> None:
        links = list(self._links.items())
        for task, _ in links:
            task.cancel()
        await asyncio.gather(*(task for task, _ in links), return_exceptions=True)
        await asyncio.gather(*(_wait_closed(w) for _, link in links for w in link.writers))
        for _, link in links:  # a task cancelled before it ran never wrapped its socket
            _reset_socket(link.client)

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up while it waited in the backlog
            except OSError:
                return  # out of descriptors, say: the client waits in the backlog meanwhile
            self._connections_accepted += 1
            if self._mode is Mode.CUT:
                _reset_socket(client)
                continue
            # Registered before the task runs, so a cut or close can always reach the socket.
            link = _Link(client)
            task = self._loop.create_task(self._serve(link))
            self._links[task] = link
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._links.pop(task, None)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._loop.call_exception_handler(
                {"message": "fault proxy connection failed", "exception": error, "task": task})

    async def _serve(self, link: _Link) -> None:
        clean = False
        try:
            reader, writer = await asyncio.open_connection(sock=link.client)
            link.writers.append(writer)
            if self._mode is Mode.BLACKHOLE:
                await self._swallow(reader)
            else:
                upstream_reader, upstream = await asyncio.open_connection(self._host, self._port)
                link.writers.append(upstream)
                await self._bridge(reader, writer, upstream_reader, upstream)
                clean = True
        except* OSError:
            pass  # one side failed: the other is reset below, as a dead path would do
        finally:
            for each in link.writers:
                if clean:
                    each.close()
                else:
                    _reset(each)
            if not link.writers:
                _reset_socket(link.client)  # it never got as far as a transport

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        while await reader.read(CHUNK_BYTES):
            pass
        # Not even the FIN crosses a partition: stay open until healed, cut or closed.
        await self._loop.create_future()

    async def _bridge(self, client_reader: asyncio.StreamReader,
                      client: asyncio.StreamWriter, upstream_reader: asyncio.StreamReader,
                      upstream: asyncio.StreamWriter) -> None:
        # Reading and writing are separate tasks joined by a queue, so a delay holds each
        # chunk for its own time instead of throttling the reader.
        async with asyncio.TaskGroup() as group:
            for source, sink in ((client_reader, upstream), (upstream_reader, client)):
                queue: asyncio.Queue[_Chunk] = asyncio.Queue(QUEUE_CHUNKS)
                group.create_task(self._collect(source, queue))
                group.create_task(self._deliver(queue, sink))

    async def _collect(self, source: asyncio.StreamReader, queue: asyncio.Queue[_Chunk]) -> None:
        while data := await source.read(CHUNK_BYTES):
            await queue.put((self._loop.time() + self._delay_s, data))
        await queue.put((self._loop.time() + self._delay_s, b""))  # EOF, after the data

    async def _deliver(self, queue: asyncio.Queue[_Chunk], sink: asyncio.StreamWriter) -> None:
        while True:
            due, data = await queue.get()
            if (wait := due - self._loop.time()) > 0:
                await asyncio.sleep(wait)
            if self._mode is Mode.BLACKHOLE:
                continue  # dropped here, not when read, so bytes in flight are lost too
            if not data:
                if sink.can_write_eof():
                    sink.write_eof()  # half-close, so request/EOF/response protocols work
                return
            self._bytes_forwarded += len(data)  # first: a reader may check it on receipt
            sink.write(data)
            await sink.drain()
