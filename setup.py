"""Builds mqlog's C log core (the Cython extension). Metadata lives in pyproject.toml.

The extension is optional at run time: without it mqlog falls back to its pure-Python
twin (``MQLOG_PUREPYTHON=1`` forces that; ``MQLOG_REQUIRE_EXTENSION=1`` forbids it).
"""

import sys
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

if sys.byteorder != "little":
    raise SystemExit("mqlog's on-disk format is little-endian and its C core assumes a little-endian host")

extensions = [
    Extension(
        "mqlog.ext._core",
        sources=["mqlog/ext/_core.pyx"],  # it includes the _*.pxi files beside it
        depends=["mqlog/ext/crc32c.h", "mqlog/ext/layout.h",
                 *sorted(str(path) for path in Path("mqlog/ext").glob("_*.pxi"))],
        include_dirs=["mqlog/ext"],
        extra_compile_args=["-O3", "-fno-strict-aliasing", "-Wno-unused-function"],
    ),
    Extension(
        "mqlog.ext._wire",
        sources=["mqlog/ext/_wire.pyx"],
        depends=["mqlog/ext/crc32c.h"],
        include_dirs=["mqlog/ext"],
        extra_compile_args=["-O3", "-fno-strict-aliasing", "-Wno-unused-function"],
    ),
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
            "embedsignature": True,
        },
    ),
)
