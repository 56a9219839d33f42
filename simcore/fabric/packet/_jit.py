"""The compiler switch of the packet kernel: numba's `njit` with an on-disk cache when numba is
installed, plain Python otherwise (the same code, far slower), and the two primitives the kernel
state is built on.

Kernel state fields that hold tables are raw pointers into arrays the state owns (`data_ptr`),
and `view` turns one back into an array for bulk copies. Reading a pointer field costs a load;
reading an array field of a numba structref costs reference-count calls (atomic operations) on
every access, which dominated the event loop. Without numba both are the identity: fields are
the numpy arrays themselves. Pointers carry no bounds: kernel code never indexes with -1 ("none").

Numba keys each cached function on its own source file only, so a kernel function compiled
against an older version of another kernel module would be reused stale. `refresh_cache` keeps a
digest of every kernel module next to the cache and clears the package's cache when any of them
changed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from simcore.compiled import import_numba

numba = import_numba()

HAVE_NUMBA = numba is not None

_PACKAGE_DIR = Path(__file__).resolve().parent
_KERNEL_MODULES = ("_jit.py", "state.py", "clock.py", "heap.py", "queues.py", "link.py",
                   "switch.py", "nic.py", "events.py", "stats.py", "api.py")


def refresh_cache() -> None:
    """Drop this package's numba cache files when any kernel module's source has changed."""
    digest = hashlib.sha256(numba.__version__.encode() if numba else b"")
    for name in _KERNEL_MODULES:
        path = _PACKAGE_DIR / name
        if path.exists():
            digest.update(path.read_bytes())
    stamp_dir = _PACKAGE_DIR / "__pycache__"
    stamp = stamp_dir / "kernel-source.sha256"
    want = digest.hexdigest()
    try:
        if stamp.exists() and stamp.read_text() == want:
            return
        stamp_dir.mkdir(exist_ok=True)
        for pattern in ("*.nbi", "*.nbc"):
            for old in stamp_dir.glob(pattern):
                old.unlink(missing_ok=True)
        stamp.write_text(want)
    except OSError:
        # A read-only install: numba then caches elsewhere or not at all; sources do not change.
        pass


if HAVE_NUMBA:
    from numba import carray
    from numba.core import types
    from numba.extending import intrinsic

    refresh_cache()

    def njit(fn):
        """Compile `fn` with numba (cached on disk)."""
        return numba.njit(cache=True)(fn)

    @intrinsic
    def _data_ptr(typingctx, arr):
        def codegen(context, builder, sig, args):
            return context.make_array(sig.args[0])(context, builder, args[0]).data
        return types.CPointer(arr.dtype)(arr), codegen

    @numba.njit(cache=True)
    def data_ptr(arr):
        """Pointer to the first element of a contiguous array (the array must stay owned)."""
        return _data_ptr(arr)

    @numba.njit(cache=True)
    def view(ptr, n):
        """The n elements at ptr as an array (borrowed: copy before it outlives the owner)."""
        return carray(ptr, n)
else:
    def njit(fn):
        return fn

    def data_ptr(arr):
        return arr

    def view(ptr, n):
        return ptr[:n]
