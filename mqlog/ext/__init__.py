"""mqlog's log core: the Cython extension, or its pure-Python twin.

One switch, as msgpack has: ``MQLOG_PUREPYTHON=1`` selects the twin
(``mqlog.ext.fallback``); otherwise the compiled ``mqlog.ext._core`` is used when it
imports, and ``MQLOG_REQUIRE_EXTENSION=1`` turns its absence into an ImportError instead
of a silent fallback. ``IMPLEMENTATION`` says which one is live. ``load(name)`` gives
either one explicitly, for tests and benchmarks that compare them.
"""

from __future__ import annotations

import os
from types import ModuleType

from mqlog.ext import fallback


def _compiled() -> ModuleType | None:
    try:
        from mqlog.ext import _core  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _core


def load(name: str | None = None) -> ModuleType:
    """The core module called ``name`` ("cython" or "python"); None: the live one."""
    if name is None:
        return core
    if name == "python":
        return fallback
    if name == "cython":
        compiled = _compiled()
        if compiled is None:
            raise ImportError("mqlog's C extension is not built: run `make setup` "
                              "(or `python setup.py build_ext --inplace`)")
        return compiled
    raise ValueError(f"unknown implementation {name!r}: use 'cython' or 'python'")


def _select() -> ModuleType:
    if os.environ.get("MQLOG_PUREPYTHON"):
        return fallback
    compiled = _compiled()
    if compiled is None and os.environ.get("MQLOG_REQUIRE_EXTENSION"):
        raise ImportError("MQLOG_REQUIRE_EXTENSION is set but mqlog's C extension is not "
                          "built: run `make setup` (or `python setup.py build_ext --inplace`)")
    return compiled if compiled is not None else fallback


core: ModuleType = _select()
IMPLEMENTATION: str = core.IMPLEMENTATION
