"""Datadriven tests (etcd raft's testdata style): a script of commands, each followed by
``----`` and the output it must produce.

    # a comment
    command arg key=value
    ----
    expected output
    (a blank line ends it)

Run a file with ``run_file(path, handler)``: ``handler(command, args, kwargs)`` returns
the output text. ``MQLOG_REWRITE=1`` rewrites the expected outputs in place (review the
diff before committing it).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Case:
    line_number: int
    command: str
    args: list[str]
    kwargs: dict[str, str]
    expected: str


def parse(text: str) -> list[Case]:
    cases, lines, index = [], text.splitlines(), 0
    while index < len(lines):
        line = lines[index].strip()
        index += 1
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line)
        assert index < len(lines) and lines[index] == "----", f"line {index}: no ---- after it"
        index += 1
        expected = []
        while index < len(lines) and lines[index] != "":
            expected.append(lines[index])
            index += 1
        args = [word for word in words[1:] if "=" not in word]
        kwargs = dict(word.split("=", 1) for word in words[1:] if "=" in word)
        cases.append(Case(index, words[0], args, kwargs, "\n".join(expected)))
    return cases


def run_file(path: Path, handler: Callable[[str, list[str], dict[str, str]], str]) -> None:
    cases = parse(path.read_text())
    outputs = [handler(case.command, case.args, case.kwargs).rstrip("\n") for case in cases]
    if os.environ.get("MQLOG_REWRITE"):
        _rewrite(path, cases, outputs)
        return
    for case, output in zip(cases, outputs, strict=True):
        assert output == case.expected, (
            f"{path.name}:{case.line_number}: {case.command} {' '.join(case.args)}\n"
            f"--- expected\n{case.expected}\n--- got\n{output}")


def _rewrite(path: Path, cases: list[Case], outputs: list[str]) -> None:
    lines, index, chunks = path.read_text().splitlines(), 0, []
    for output in outputs:
        while not lines[index].strip() or lines[index].startswith("#"):
            chunks.append(lines[index])
            index += 1
        chunks += [lines[index], "----", *([output] if output else [])]
        index += 2
        while index < len(lines) and lines[index] != "":
            index += 1
    chunks += lines[index:]
    path.write_text("\n".join(chunks) + "\n")
    assert len(cases) == len(outputs)
