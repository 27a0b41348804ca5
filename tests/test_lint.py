"""ruff and cython-lint run as tests (DESIGN §7), so style rot fails the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_ruff_is_clean():
    trees = [name for name in ("mqlog", "tests", "benchmarks") if (ROOT / name).is_dir()]
    result = _run("ruff", "check", *trees)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean():
    result = _run("mypy", "mqlog")
    assert result.returncode == 0, result.stdout + result.stderr


def test_cython_lint_is_clean():
    if not list((ROOT / "mqlog" / "ext").glob("*.pyx")):
        pytest.skip("no Cython sources yet")
    # cython-lint has no `python -m` form and runs pycodestyle by name: use the venv's bin.
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([str(bin_dir / "cython-lint"), "mqlog/ext"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
