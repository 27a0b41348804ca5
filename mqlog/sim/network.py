"""The simulated network: seeded loss, delay (and so reordering), duplication, partitions.

Messages go through the real wire codec (encode, then decode) so the simulator also
exercises it. Time is the simulator's tick; nothing here reads a clock.

Brokers that host many replica groups (sim/brokers.py) share one network between every
pair of them, as broker.py shares one connection per peer: each frame names its group
and its topic id (``send(message, group, topic_id)``, the header keys as the broker
writes them) and ``due_frames`` hands back (frame, message) pairs: the receiving
broker routes the frame as broker.py does (``route_peer_frame``). A partition cuts
every group's messages between the two brokers at once.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from mqlog.replication import messages
from mqlog.replication.messages import Message
from mqlog.replication.wire import Frame, FrameDecoder


@dataclass
class NetworkOptions:
    drop_probability: float = 0.0
    duplicate_probability: float = 0.0
    delay_ticks_max: int = 1  # each copy arrives 1..this many ticks after it was sent


@dataclass
class SimNetwork:
    rng: random.Random
    options: NetworkOptions
    now: int = 0
    partitioned: set[frozenset[str]] = field(default_factory=set)
    _queue: list[tuple[int, int, bytes]] = field(default_factory=list)
    _sequence: int = 0
    sent_count: int = 0
    dropped_count: int = 0

    def send(self, message: Message, group: str = "", topic_id: int = 0) -> None:
        self.sent_count += 1
        if self.rng.random() < self.options.drop_probability or self._cut(message):
            self.dropped_count += 1
            return
        copies = 2 if self.rng.random() < self.options.duplicate_probability else 1
        for _ in range(copies):
            self._sequence += 1
            arrival = self.now + self.rng.randint(1, self.options.delay_ticks_max)
            heapq.heappush(self._queue, (arrival, self._sequence,
                                         messages.encode(message, group, topic_id)))

    def due(self) -> list[Message]:
        """Messages that arrive at this tick, in arrival order (dropped if cut since)."""
        return [message for _frame, message in self.due_frames()]

    def due_frames(self) -> list[tuple[Frame, Message]]:
        """(frame, the message it carries) of each message that arrives at this tick, in
        arrival order (dropped if cut since)."""
        arrived = []
        while self._queue and self._queue[0][0] <= self.now:
            _, _, data = heapq.heappop(self._queue)
            frame, message = _decode(data)
            if self._cut(message):
                self.dropped_count += 1
            else:
                arrived.append((frame, message))
        return arrived

    def partition(self, a: str, b: str) -> None:
        self.partitioned.add(frozenset((a, b)))

    def heal(self) -> None:
        self.partitioned.clear()

    @property
    def in_flight(self) -> int:
        return len(self._queue)

    def _cut(self, message: Message) -> bool:
        return frozenset((message.src, message.dst)) in self.partitioned


def _decode(data: bytes) -> tuple[Frame, Message]:
    decoder = FrameDecoder(1 << 30)
    decoder.feed(data)
    frame = decoder.next_frame()
    assert isinstance(frame, Frame)
    return frame, messages.decode(frame)
