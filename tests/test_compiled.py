"""The project's kernels import numba without numba's BLAS check loading scipy.linalg, and leave
scipy.linalg importable after."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("numba")

PROBE = """
import sys
from simcore.engine.array_pool import ArrayBlockPool
pool = ArrayBlockPool(100, True)
blocks = pool.allocate(5)
pool.cache_many(blocks, [1, 2, 3, 4, 5])
assert pool.longest_cached([1, 2, 3, 9]) == blocks[:3]
print("scipy.linalg" in sys.modules, "scipy.linalg.cython_blas" in sys.modules)
import scipy.linalg.cython_blas
import scipy.linalg
print(scipy.linalg.cython_blas.__name__, float(scipy.linalg.norm([3.0, 4.0])))
"""


def test_kernels_run_without_loading_scipy_linalg_and_leave_it_importable():
    pytest.importorskip("scipy")
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0] == "False False"
    assert out[1] == "scipy.linalg.cython_blas 5.0"
