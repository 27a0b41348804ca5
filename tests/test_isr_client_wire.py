"""The client side of acks=0 against a scripted node on 127.0.0.1: a refusal of an
unanswered send is read by a later call (and counted, typed), whatever it arrives
among; an answer naming a request that was never sent, or one still to come, is a
RemoteProtocolError, not taken for the call's answer."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest

from mqlog import errors
from mqlog.client import Client
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame
from mqlog.results import PutStatus

Script = Callable[[Frame], list[dict[str, Any]]]


class _Scripted:
    """A node that answers each request frame with what ``script`` returns for it."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            connection, _ = self.server.accept()
        except OSError:
            return
        with connection, contextlib.suppress(OSError):  # (the client hung up on it)
            decoder = FrameDecoder(1 << 20)
            while data := connection.recv(1 << 16):
                decoder.feed(data)
                while isinstance(frame := decoder.next_frame(), Frame):
                    for header in self.script(frame):
                        connection.sendall(encode_frame(header))

    def close(self) -> None:
        self.server.close()


def _refused(frame: Frame) -> dict[str, Any]:
    return {"kind": "error", "error": "NotLeader", "message": "not here", "leader": "b2",
            "id": frame.header["id"]}


def _produced(frame: Frame) -> dict[str, Any]:
    return {"kind": "produced", "status": "PUT_OK", "position": 7, "offset": 1, "count": 1,
            "id": frame.header["id"]}


def test_a_refused_acks0_send_is_read_by_the_next_call_in_any_order() -> None:
    held: list[Frame] = []

    def script(frame: Frame) -> list[dict[str, Any]]:
        if frame.header.get("acks") == "0":
            held.append(frame)  # answered later, after the next call's answer
            return []
        return [_produced(frame), *(_refused(old) for old in held)]
    node = _Scripted(script)
    try:
        with Client(node.address, timeout_s=10) as client:
            assert client.produce("t", b"a", acks=0).position == -1
            assert client.produce("t", b"b", acks=1).status is PutStatus.PUT_OK
            assert client.refused == 0  # (came after the call's answer: not read yet)
            assert client.produce("t", b"c", acks="1").position == 7  # reads it now
            assert client.refused == 1 and isinstance(client.refusals[0], errors.NotLeader)
            assert client.produce("t", b"d", acks="0").offset == -1
    finally:
        node.close()


@pytest.mark.parametrize("shift", [1, -99, None])
def test_an_answer_to_no_request_sent_is_a_protocol_error(shift: int | None) -> None:
    def script(frame: Frame) -> list[dict[str, Any]]:
        answer = _produced(frame)
        answer["id"] = None if shift is None else frame.header["id"] + shift
        return [answer]
    node = _Scripted(script)
    try:
        with Client(node.address, timeout_s=10) as client, \
                pytest.raises(errors.RemoteProtocolError, match="another request"):
            client.produce("t", b"x", acks=1)
    finally:
        node.close()
