"""Questions a replication core asks of its mirror of the log's epochs.

A core (Raft, ISR) keeps ``_epochs``, the log's (epoch, start position) pairs in
position order, and ``_end``, where its log ends with pending appends counted; these
answers are the same whatever the layer, so both cores inherit them from here.
"""

from __future__ import annotations


class EpochMirror:
    """Mixed into a core that keeps ``_epochs`` and ``_end`` (see the module docstring)."""

    _epochs: list[tuple[int, int]]
    _end: int

    def _epoch_at(self, position: int) -> int:
        """The epoch of the record ending at ``position`` (-1: none)."""
        found = -1
        for epoch, start in self._epochs:
            if start >= position:
                break
            found = epoch
        return found

    def _epoch_from(self, position: int) -> int:
        """The epoch of the record starting at ``position``."""
        found = -1
        for epoch, start in self._epochs:
            if start > position:
                break
            found = epoch
        return found

    def _epoch_range_end(self, position: int) -> int:
        """Where the epoch of the record starting at ``position`` ends."""
        return next((start for _, start in self._epochs if start > position), self._end)

    def _end_of_epoch(self, epoch: int) -> int:
        """Where the log's records of ``epoch`` and older end."""
        return next((start for started, start in self._epochs if started > epoch), self._end)

    def _newest_epoch_up_to(self, epoch: int) -> int:
        """The newest epoch in the log no newer than ``epoch`` (-1: none)."""
        found = -1
        for started, _start in self._epochs:
            if started > epoch:
                break
            found = started
        return found
