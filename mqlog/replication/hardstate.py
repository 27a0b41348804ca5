"""A Raft node's hard state — its term and its vote — in one small file beside the store.

It must be durable before the node answers anyone (a vote given and forgotten in a crash
lets one term have two leaders), so each save writes a new file, syncs it, renames it over
the old one and syncs the directory. The line holds a CRC32C, so a damaged file is an
error that names itself, never a silent term 0 (docs/FORMAT.md)::

    mqlog-raft-state 1 <term> <vote or -> <crc32c of the text before it, hex>
"""

from __future__ import annotations

import os
from pathlib import Path

from crc32c import crc32c

from mqlog.errors import CorruptStore

FILE_NAME = "raft-state"
_MAGIC = "mqlog-raft-state 1"


def load(directory: Path) -> tuple[int, str]:
    """(term, vote) saved in ``directory``; (0, "") if none was ever saved."""
    path = directory / FILE_NAME
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0, ""
    body, _, crc = text.rpartition(" ")
    words = body.split(" ")
    if len(words) != 4 or " ".join(words[:2]) != _MAGIC or crc != f"{crc32c(body.encode()):08x}" \
            or not words[2].isdigit():
        raise CorruptStore(f"{path} is damaged (bad magic, fields or CRC): this node's Raft "
                           "term and vote are unknown; restore it from a backup or wipe this "
                           "node's data and let it rejoin as an empty follower")
    return int(words[2]), "" if words[3] == "-" else words[3]


def save(directory: Path, term: int, vote: str) -> None:
    """Write (term, vote) durably (see the module docstring)."""
    assert term >= 0 and " " not in vote
    body = f"{_MAGIC} {term} {vote or '-'}"
    temporary = directory / (FILE_NAME + ".tmp")
    with open(temporary, "w") as file:
        file.write(f"{body} {crc32c(body.encode()):08x}\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / FILE_NAME)
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
