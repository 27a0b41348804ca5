"""mqlog's C extensions, or their pure-Python twins.

Two pairs: the log core (``_core`` / ``fallback``) and the wire codec (``_wire`` /
``wire_fallback``). One switch, as msgpack has: ``MQLOG_PUREPYTHON=1`` selects the
twins; otherwise the compiled modules are used when they import, and
``MQLOG_REQUIRE_EXTENSION=1`` turns their absence into an ImportError instead of a
silent fallback. ``core`` and ``wire`` are the live modules, ``IMPLEMENTATION`` says
which kind. ``load(name)`` and ``load_wire(name)`` give either one explicitly, for tests
and benchmarks that compare them.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from mqlog.ext import fallback, wire_fallback


def _compiled(name: str = "_core") -> ModuleType | None:
    try:
        return importlib.import_module(f"mqlog.ext.{name}")
    except ImportError:
        return None


def load(name: str | None = None) -> ModuleType:
    """The core module called ``name`` ("cython" or "python"); None: the live one."""
    if name is None:
        return core
    return _explicit(name, "_core", fallback)


def load_wire(name: str | None = None) -> ModuleType:
    """The wire codec called ``name`` ("cython" or "python"); None: the live one."""
    if name is None:
        return wire
    return _explicit(name, "_wire", wire_fallback)


def _explicit(name: str, compiled_name: str, twin: ModuleType) -> ModuleType:
    if name == "python":
        return twin
    if name == "cython":
        compiled = _compiled(compiled_name)
        if compiled is None:
            raise ImportError("mqlog's C extension is not built: run `make setup` "
                              "(or `python setup.py build_ext --inplace`)")
        return compiled
    raise ValueError(f"unknown implementation {name!r}: use 'cython' or 'python'")


def _select(compiled_name: str, twin: ModuleType) -> ModuleType:
    if os.environ.get("MQLOG_PUREPYTHON"):
        return twin
    compiled = _compiled(compiled_name)
    if compiled is None and os.environ.get("MQLOG_REQUIRE_EXTENSION"):
        raise ImportError("MQLOG_REQUIRE_EXTENSION is set but mqlog's C extension is not "
                          "built: run `make setup` (or `python setup.py build_ext --inplace`)")
    return compiled if compiled is not None else twin


core: ModuleType = _select("_core", fallback)
wire: ModuleType = _select("_wire", wire_fallback)
IMPLEMENTATION: str = core.IMPLEMENTATION
