"""A broker's connection: an asyncio ``BufferedProtocol`` that receives straight into its
frame decoder, and a writer with the StreamWriter calls the broker and its groups use.

Why not streams. A stream reader copies every byte it reads twice (into its buffer, out
of it), and each read wakes a task: a future resolved, a task step, a coroutine resumed,
for every chunk of every fetch answer a follower receives and every produce request a
leader does. Here the socket writes into the decoder's buffer (``FrameDecoder.get_buffer``:
its room grows with what arrives, wire.py says how), and the owner is called back in the
same loop iteration with every whole frame in it: a frame's bytes are copied once, into
its payload, and no task runs until the owner makes one.

The owner (the broker) is told of three things: ``connected(connection)`` once the
socket is up (a dialed connection's peer is ``connection.peer``, set before it), with
``received(connection)`` whenever frames may be whole (``connection.decoder.next_frame``
hands them out; a RemoteProtocolError it raises is the owner's to handle), and
``lost(connection)`` once, when the connection ends, whoever ended it.

Writing. ``write`` queues bytes on the transport (it sends at once what the socket
takes), ``write_frames`` frames in pieces (a large payload is not copied into its
frame, and a FileExtent payload — a leader's records — goes from the log's file by
``sendfile`` while the transport holds nothing: ``sent_from_file`` counts it);
``drain()`` waits while the transport holds more than its high-water mark, as a
StreamWriter's does, and raises ConnectionResetError once the connection is lost;
``answer(data)`` is both, for a request's answer (the broker's and its groups' one way
to answer).

Holding reading back (Kafka mutes a channel until its response is sent). The owner
takes no frame out of the decoder, and the socket is not read, while reading is held for
any reason: ``BUSY``, the owner's (a broker holds a client's connection while it handles
``client_requests_in_progress_max`` of its requests), or ``BACKED_UP``, a client's
connection whose transport holds more than the high-water mark (its answers are not
read). Once the last reason goes, the owner is called back (in the next loop iteration:
not from inside the transport's callbacks) to take the frames waiting in the decoder,
and the socket is read again. A client that sends and never reads makes the
broker hold at most that many answers, not all it ever asked for, and its own sends
block. A peer link is never held back: two brokers each backed up towards the other would
wait on each other for ever (each link carries requests both ways).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import socket
from collections.abc import Sequence
from typing import Any, Protocol

from mqlog.engine.files import FileExtent
from mqlog.replication.wire import WRITTEN_APART_BYTES, FrameDecoder

__all__ = ["BACKED_UP", "BUSY", "Connection", "ConnectionOwner"]
BUSY = "busy"  # a reason to hold reading back: the owner handles enough of its requests
BACKED_UP = "backed up"  # ... the transport holds more than its high-water mark


class ConnectionOwner(Protocol):
    def connected(self, connection: Connection) -> None: ...

    def received(self, connection: Connection) -> None: ...

    def lost(self, connection: Connection) -> None: ...


class Connection(asyncio.BufferedProtocol):
    """One TCP connection of a broker (a client's or a peer's); see the module docstring."""

    def __init__(self, owner: ConnectionOwner, frame_size_bytes_max: int,
                 peer: str = "") -> None:
        self.owner = owner
        self.decoder = FrameDecoder(frame_size_bytes_max)
        self.peer = peer  # the broker this one dialed ("": accepted)
        self.link: Any = None  # the owner's: what this connection is to it
        self.transport: asyncio.Transport | None = None
        self._paused = False  # the transport holds more than its high-water mark
        self.holds_back = not peer  # held back while BACKED_UP (a client's, not a peer link's)
        self._held: set[str] = set()  # why reading is held back (BUSY, BACKED_UP)
        self.requests_in_progress = 0  # the owner's count of a client's requests
        # what each drain() waits on (its own: one drainer cancelled cancels no other)
        self._drainers: collections.deque[asyncio.Future[None]] = collections.deque()
        self._lost = False
        self.sent_from_file = 0  # bytes sendfile sent (FileExtent payloads)

    # --- the transport's calls ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.owner.connected(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.decoder.buffer_updated(nbytes)
        self.owner.received(self)

    def eof_received(self) -> bool:
        return False  # (the transport closes: a peer that stops sending is done)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._wake_drainers()
        self.owner.lost(self)

    def pause_writing(self) -> None:
        self._paused = True
        if self.holds_back:
            self.hold_reading(BACKED_UP)

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drainers()  # (first: the tasks that waited write before new ones start)
        self.release_reading(BACKED_UP)

    # --- holding reading back (the module docstring says why) ------------------------------

    @property
    def reading_held(self) -> bool:
        return bool(self._held)

    @property
    def backed_up(self) -> bool:
        """The transport holds more than its high-water mark (until it drains to its
        low-water mark)."""
        return self._paused

    def hold_reading(self, why: str) -> None:
        if not self._held and not self.is_closing():
            assert self.transport is not None
            self.transport.pause_reading()
        self._held.add(why)

    def release_reading(self, why: str) -> None:
        """Drop a reason to hold reading back; the last one gone, the owner takes the
        frames waiting in the decoder and the socket is read again."""
        if why not in self._held:
            return
        self._held.discard(why)
        if not self._held and not self.is_closing():
            assert self.transport is not None
            self.transport.resume_reading()
            # (soon, not now: called from the transport's own callback, resume_writing,
            # an owner that closes the connection on garbage makes asyncio 3.11 call
            # connection_lost twice; the drainers woken before still write first)
            asyncio.get_running_loop().call_soon(self._take_waiting)

    def _take_waiting(self) -> None:
        if not self._held and not self.is_closing():
            self.owner.received(self)

    def _wake_drainers(self) -> None:
        while self._drainers:
            drainer = self._drainers.popleft()
            if not drainer.done():
                drainer.set_result(None)

    # --- the writer's calls (what the broker and its groups use of a StreamWriter) -------

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def write_frames(self, pieces: Sequence[bytes | FileExtent]) -> None:
        """Write frames given in pieces (messages.encode_pieces): each run of small
        pieces joined into one write, each large one (a fetch answer's records) written as
        it is, not copied (the transport sends it at once if it holds nothing, and copies
        only what the socket did not take), a FileExtent sent from its file
        (``_send_file``). The socket is corked meanwhile, so a head and its payload leave
        in full segments, not a small one first."""
        if all(type(piece) is bytes and len(piece) < WRITTEN_APART_BYTES
               for piece in pieces):
            self.write(pieces[0] if len(pieces) == 1 else b"".join(pieces))  # type: ignore
            return
        sock = self.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
        try:
            run: list[bytes] = []
            for piece in pieces:
                if type(piece) is bytes and len(piece) < WRITTEN_APART_BYTES:
                    run.append(piece)
                    continue
                if run:
                    self.write(b"".join(run))
                    run = []
                if isinstance(piece, FileExtent):
                    self._send_file(piece, sock)
                else:
                    self.write(piece)
            if run:
                self.write(b"".join(run))
        finally:
            if sock is not None and not self.is_closing():
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)

    def _send_file(self, extent: FileExtent, sock: Any) -> None:
        """Send ``extent`` from its file with ``sendfile`` (the kernel moves the page
        cache's pages to the socket: no read, no copy here) while the transport holds
        nothing (what it holds goes first); what the socket does not take now (and the
        extent's zeros) is read and written as bytes, behind it. A file that cannot be
        read mid-frame leaves the stream unusable: the connection is dropped."""
        sent = 0
        if self.is_closing():
            return
        if sock is not None and self.write_buffer_size() == 0:
            with contextlib.suppress(OSError):  # (full: the rest waits; broken: the
                while sent < extent.file_size:  # transport finds out at its next write)
                    count = os.sendfile(sock.fileno(), extent.fileno(),
                                        extent.offset + sent, extent.file_size - sent)
                    if count == 0:  # (the file ends early: read() gives zeros)
                        break
                    sent += count
        self.sent_from_file += sent
        if sent < extent.size:
            try:
                rest = extent.read(sent)
            except OSError:
                self.abort()
                return
            self.write(rest)

    async def drain(self) -> None:
        """Wait while the transport holds more than its high-water mark."""
        if self._lost:
            raise ConnectionResetError("the connection is lost")
        if self._paused:
            drainer = asyncio.get_running_loop().create_future()
            self._drainers.append(drainer)
            try:
                await drainer
            finally:
                if drainer in self._drainers:  # (cancelled: it waits no more)
                    self._drainers.remove(drainer)
            if self._lost:
                raise ConnectionResetError("the connection is lost")

    async def answer(self, data: bytes) -> None:
        """Write a request's answer and wait while the transport holds too much (a
        client that does not read holds back only its own answers); a connection closing
        or lost takes nothing and is not waited for."""
        if not self.is_closing():
            self.write(data)
            with contextlib.suppress(ConnectionError):
                await self.drain()

    def write_buffer_size(self) -> int:
        """Bytes written and not yet taken by the socket."""
        return self.transport.get_write_buffer_size() if self.transport else 0

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        """Close once what was written is sent."""
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what was not sent (a broker that stops: a peer that does
        not read must not keep the connection open)."""
        if self.transport is not None:
            self.transport.abort()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default) if self.transport else default
