"""The fault proxy against a tiny echo server: forwarding, cut, blackhole, delay, shutdown."""

from __future__ import annotations

import gc
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from mqlog.replication.local import wait_until
from tests.faultproxy import FaultProxy

TIMEOUT_S = 3.0
SILENCE_S = 0.25  # how long "no echo" has to last to count as a dropped message

# An unclosed socket or transport anywhere (proxy, echo server or test) fails the test.
pytestmark = pytest.mark.filterwarnings("error::ResourceWarning",
                                        "error::pytest.PytestUnraisableExceptionWarning")


class _Complaints(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(autouse=True)
def leaves_nothing_behind() -> Iterator[None]:
    """Torn down last: no asyncio complaint ("Task was destroyed but it is pending", an
    exception in a callback), no thread left running, no garbage holding a socket."""
    threads = set(threading.enumerate())
    complaints = _Complaints()
    logging.getLogger("asyncio").addHandler(complaints)
    try:
        yield
        gc.collect()  # sockets held by reference cycles warn now, inside this test
    finally:
        logging.getLogger("asyncio").removeHandler(complaints)
    assert not complaints.messages
    assert set(threading.enumerate()) <= threads


class EchoServer:
    """Echoes every byte back on 127.0.0.1; remembers what it received and what is open."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.02)  # the accept loop polls for stop() at this rate
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.received = bytearray()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            with self._lock:
                self._open.add(conn)
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                with self._lock:
                    self.received += data
                conn.sendall(data)
        except OSError:
            pass  # reset by the proxy: that is what several tests do
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()

    def close(self) -> None:
        self._stopping.set()
        self._acceptor.join()
        self._listener.close()
        with self._lock:
            for conn in self._open:  # wakes the blocked recv() of its echo thread
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for thread in self._threads:
            thread.join()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(echo.address) as fault_proxy:
        yield fault_proxy


@pytest.fixture
def connect(proxy: FaultProxy) -> Iterator[Callable[[], socket.socket]]:
    """connect() opens a client socket to the proxy; all are closed at the end."""
    sockets: list[socket.socket] = []

    def _connect() -> socket.socket:
        host, port = proxy.address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        sockets.append(sock)
        return sock

    yield _connect
    for sock in sockets:
        sock.close()


def round_trip(sock: socket.socket, message: bytes) -> bytes:
    sock.settimeout(TIMEOUT_S)
    sock.sendall(message)
    return receive(sock, len(message))


def receive(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def assert_closed(sock: socket.socket) -> None:
    """The peer closed or reset ``sock``: recv() returns b"" or raises, within the timeout."""
    sock.settimeout(TIMEOUT_S)
    try:
        while sock.recv(65536):
            pass  # bytes already in flight may come first; the close must come after them
    except ConnectionError:
        pass


def assert_refused(connect: Callable[[], socket.socket]) -> None:
    """A new connection is accepted, then closed at once (the reset can beat connect())."""
    try:
        sock = connect()
    except ConnectionError:
        return
    assert_closed(sock)


def assert_silent(sock: socket.socket, message: bytes) -> None:
    """``message`` goes out but nothing comes back, and the connection stays open."""
    sock.sendall(message)
    sock.settimeout(SILENCE_S)
    with pytest.raises(TimeoutError):
        sock.recv(65536)


def test_forwards_bytes_both_ways_and_counts_them(proxy, connect) -> None:
    assert (proxy.bytes_forwarded, proxy.connections_accepted) == (0, 0)
    sock = connect()
    assert round_trip(sock, b"hello") == b"hello"
    # Bigger than every buffer on the path, sent while reading, so flow control is exercised.
    payload = bytes(range(256)) * 4096
    sender = threading.Thread(target=sock.sendall, args=(payload,))
    sender.start()
    echoed = receive(sock, len(payload))
    sender.join()
    assert echoed == payload
    assert proxy.connections_accepted == 1
    assert proxy.bytes_forwarded == 2 * (5 + len(payload))


def test_half_close_is_forwarded(proxy, connect, echo) -> None:
    sock = connect()
    sock.sendall(b"last words")
    sock.shutdown(socket.SHUT_WR)
    assert receive(sock, 100) == b"last words"  # then EOF, once the echo server closed
    wait_until(lambda: echo.open_connections == 0, "the echo server to see the EOF", TIMEOUT_S)


def test_cut_resets_open_connections_and_refuses_new_ones(proxy, connect, echo) -> None:
    sock = connect()
    assert round_trip(sock, b"before") == b"before"
    proxy.cut()
    assert_closed(sock)
    wait_until(lambda: echo.open_connections == 0, "the upstream side to be cut", TIMEOUT_S)
    assert_refused(connect)
    assert proxy.connections_accepted == 2
    proxy.heal()
    assert round_trip(connect(), b"after") == b"after"
    assert proxy.connections_accepted == 3


def test_blackhole_drops_bytes_silently_until_healed(proxy, connect, echo) -> None:
    old = connect()
    assert round_trip(old, b"before") == b"before"
    proxy.blackhole()
    assert_silent(old, b"lost-on-old")
    born_in_blackhole = connect()
    assert_silent(born_in_blackhole, b"lost-on-new")
    assert echo.open_connections == 1  # nothing told the far side either
    proxy.heal()
    assert_closed(old)
    assert_closed(born_in_blackhole)
    assert round_trip(connect(), b"after") == b"after"
    assert b"lost" not in echo.received
    assert proxy.connections_accepted == 3


def test_delay_holds_every_chunk_and_keeps_the_order(proxy, connect) -> None:
    sock = connect()
    assert round_trip(sock, b"fast") == b"fast"
    proxy.delay(200)
    started = time.monotonic()
    assert round_trip(sock, b"slow") == b"slow"
    assert time.monotonic() - started >= 0.15
    messages = [b"%03d," % n for n in range(50)]
    for message in messages:  # separate sends, so several chunks are in the queue at once
        sock.sendall(message)
    assert receive(sock, 4 * len(messages)) == b"".join(messages)


SWITCHES: dict[str, Callable[[FaultProxy], None]] = {
    "heal": FaultProxy.heal,
    "blackhole": FaultProxy.blackhole,
    "delay": lambda fault_proxy: fault_proxy.delay(50),
    "cut": FaultProxy.cut,
}


@pytest.mark.parametrize("mode", SWITCHES)
def test_close_while_busy_leaves_nothing_behind(echo, mode) -> None:
    """Closed with connections open in ``mode`` and a client connecting in a loop meanwhile;
    leaves_nothing_behind then checks that no socket, task or thread outlived it."""
    fault_proxy = FaultProxy(echo.address)
    host, port = fault_proxy.address.rsplit(":", 1)
    clients: list[socket.socket] = []
    stop = threading.Event()
    hammer = threading.Thread(target=_connect_until, args=(host, int(port), stop))
    try:
        clients.append(socket.create_connection((host, int(port)), timeout=TIMEOUT_S))
        clients[0].sendall(b"in flight")
        SWITCHES[mode](fault_proxy)
        hammer.start()
        wait_until(lambda: fault_proxy.connections_accepted >= 5, "the hammer", TIMEOUT_S)
        fault_proxy.close()
    finally:
        fault_proxy.close()  # idempotent
        stop.set()
        if hammer.is_alive():
            hammer.join()
        for client in clients:
            client.close()


def _connect_until(host: str, port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            # A short timeout: a SYN caught by the listener's close is only retried after 1 s.
            socket.create_connection((host, port), timeout=0.1).close()
        except OSError:
            pass  # reset, refused or timed out: all expected around a cut or a close
