"""Kernels written as plain Python over numbers and numpy arrays, compiled by numba where it is
installed (the flow backend's solvers, the step-DAG exposure walk, the engine's block pool and
quiet-run timing). numba is imported when a kernel is made: at the import of a module that
makes its kernels as it loads (`simcore.engine.array_pool`), on first use for those made
lazily (`simcore.dag.exposure`, `simcore.compute.decode_steps`). Without numba each kernel is
its Python source, which computes the same to the bit, only slower."""

from __future__ import annotations

import sys

_NOT_YET = object()
_numba = _NOT_YET


def import_numba():
    """numba, or None where it is not installed. Imported with its check for a BLAS answered
    "none": when numba first compiles or loads a kernel it imports `numba.np.arraymath`, which
    imports scipy.linalg's BLAS bindings to offer `np.dot` (about 0.2 CPU-s, in every process
    that runs a kernel). No kernel of this project calls BLAS, so where scipy.linalg is not
    imported yet, that module is imported with the bindings hidden; they are importable again
    at once after (scipy.linalg itself is unaffected)."""
    global _numba
    if _numba is not _NOT_YET:
        return _numba
    try:
        import numba
    except ImportError:  # pragma: no cover - exercised only where numba is absent
        _numba = None
        return None
    blas = "scipy.linalg.cython_blas"
    if "numba.np.arraymath" not in sys.modules and "scipy.linalg" not in sys.modules:
        sys.modules[blas] = None        # `import` of it fails at once, its parents untouched
        try:
            import numba.np.arraymath  # noqa: F401
        finally:
            if blas in sys.modules and sys.modules[blas] is None:
                del sys.modules[blas]
    _numba = numba
    return numba


def compile_kernel(fn=None, *, inline: bool = False):
    """`fn` compiled by numba (cached on disk) where numba is installed; else `fn` itself, which
    computes the same to the bit, only slower. `inline=True` (as `@compile_kernel(inline=True)`)
    makes numba inline it into the kernels that call it: a helper called per element then
    costs no call, nor the reference counting of each array it takes."""
    if fn is None:
        return lambda f: compile_kernel(f, inline=inline)
    numba = import_numba()
    if numba is None:  # pragma: no cover - exercised only where numba is absent
        return fn
    return numba.njit(cache=True, **({"inline": "always"} if inline else {}))(fn)


def compile_family(fns: list) -> list:
    """Compiled copies of the plain-Python functions `fns` (as `compile_kernel`), each one's
    calls to another of them resolving to that one's compiled copy; the functions themselves
    are left as they are, for Python callers. Every copy but the last (the family's entry) is
    inlined where it is called, so that a call in a loop costs neither a call nor the
    reference counting of the arrays it passes. Where numba is not installed, `fns` itself."""
    numba = import_numba()
    if numba is None:  # pragma: no cover - exercised only where numba is absent
        return list(fns)
    import types

    envs = [dict(fn.__globals__) for fn in fns]
    last = len(fns) - 1
    copies = [numba.njit(cache=True, **({} if k == last else {"inline": "always"}))(
                  types.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__,
                                     fn.__closure__))
              for k, (fn, env) in enumerate(zip(fns, envs))]
    for env in envs:
        env.update({fn.__name__: copy for fn, copy in zip(fns, copies)})
    return copies
