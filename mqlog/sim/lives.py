"""A simulated client's producer ids across restarts of the client (the Raft and ISR
simulators' clients), and the checker of the producer tags in a log.

On some seeds (``RESTART_SEED_SHARE``, drawn apart from the seed's generator, so a seed
whose client never restarts runs as it did before restarts existed) the client restarts
now and then (``RESTART_PROBABILITY`` a tick): it forgets every write it waited on (a
new process knows nothing of its earlier life's requests: their outcome is unknown, and
they are not checked), keeps its producer ids, and starts their sequences over at 1 —
what a user's process restarted with an explicit ``producer_id`` does. Its new epoch is
the one a real client takes (idempotence.py's ``producer_epoch``, from the simulated
clock); the first life's is 0, the tag of before epochs (its records are as they were).
A leader that took the new life's writes for the old life's would answer them with the
old records' places: the simulators' "acknowledged write lost" checkers see it.

``tag_problems``: in a log, each producer's records are in non-decreasing epoch order (a
leader refuses a lower epoch than one it holds), and no (id, epoch, sequence) is stored
twice. A request of several records (partial.py) is one run of records with its tag, in
one queue: a second run of the same tag is a second copy. (How many records one run holds
is partial.py's check.)
"""

from __future__ import annotations

import random
from typing import Any

from mqlog.replication.idempotence import ProducerTag, producer_epoch

RESTART_SEED_SHARE = 0.5  # seeds whose client restarts
RESTART_PROBABILITY = 0.003  # a tick, on those seeds
TICK_MS = 10  # a tick of the simulated clock, as the client's wall clock sees it


class ProducerLives:
    """The client's producer ids, the epoch of its current life and their sequences."""

    def __init__(self, seed: int, tick_ms: int = TICK_MS) -> None:
        self._rng = random.Random(f"{seed}/producer-restarts")
        self.restarts = self._rng.random() < RESTART_SEED_SHARE
        self.tick_ms = tick_ms
        self.epoch = 0
        self.lives = 1
        self._sequences: dict[str, int] = {}

    def next(self, producer_id: str) -> ProducerTag:
        """The tag of the next request of ``producer_id`` in this life."""
        sequence = self._sequences[producer_id] = self._sequences.get(producer_id, 0) + 1
        return producer_id, sequence, self.epoch

    def maybe_restart(self, tick: int) -> bool:
        """Whether the client restarts at ``tick`` (then: a new epoch, sequences anew)."""
        if not self.restarts or self._rng.random() >= RESTART_PROBABILITY:
            return False
        self.epoch = producer_epoch(tick * self.tick_ms * 1_000_000, self.epoch)
        self._sequences.clear()
        self.lives += 1
        return True


def tags_of(records: list[Any]) -> list[ProducerTag]:
    """The producer tags of ``records`` (store records), in their order."""
    tags = []
    for record in records:
        properties = record.properties
        producer_id, sequence = properties.get("producer_id"), properties.get("sequence")
        if isinstance(producer_id, str) and isinstance(sequence, int):
            tags.append((producer_id, sequence, properties.get("producer_epoch", 0)))
    return tags


def tag_problems(tags: list[ProducerTag]) -> list[str]:
    """What is wrong with a log's producer tags, in log order (see the module docstring)."""
    problems: list[str] = []
    epochs: dict[str, int] = {}
    seen: dict[ProducerTag, int] = {}
    previous: ProducerTag | None = None
    for producer_id, sequence, epoch in tags:
        if epoch < epochs.get(producer_id, epoch):
            problems.append(f"producer {producer_id}'s epoch {epoch} (sequence {sequence}) "
                            f"stored after its epoch {epochs[producer_id]}")
        epochs[producer_id] = max(epoch, epochs.get(producer_id, epoch))
        key = (producer_id, sequence, epoch)
        if key != previous:  # (the next record of one request's run is not a copy)
            seen[key] = seen.get(key, 0) + 1
        previous = key
    problems += [f"write {producer_id} e{epoch} s{sequence} is stored {count} times"
                 for (producer_id, sequence, epoch), count in sorted(seen.items()) if count > 1]
    return problems
