"""Live CPU tensor bytes counted at torch's CPU allocator, on every thread: the truth for CPU peaks.

``torch.profiler`` records allocations and frees only on the threads it profiles. gloo completes asynchronous
collectives on worker threads of its own, and a buffer whose last reference drops there (ZeRO-3's all-gather
buffers) is freed without a record: the profiler's running sum keeps it alive, over-counting the peak by whatever
such frees leave behind (on 2 CPU ranks, 2.1-2.4 MiB of a 12 MiB ZeRO-3 peak, found as live addresses the allocator
handed out again). This shim (``counting_allocator.cpp``) wraps torch's CPU allocator (``c10::SetCPUAllocator``) and
counts each allocation's bytes in and its free out with atomics, whichever thread makes them, keeping the high-water
mark: the CPU counterpart of ``torch.cuda.max_memory_allocated``. Tensors allocated before it is installed are not
counted, in or out.

It is compiled once per torch build with the machine's C++ compiler (about 2 s; the c10 headers and library come with
torch) into the torch extensions folder, and loaded with :mod:`ctypes`. Where no compiler is found,
:func:`counting_allocator` returns None and the caller falls back to the profiler's records.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("counting_allocator.cpp")
_loaded: CountingAllocator | None = None


class CountingAllocator:
    """The installed shim: bytes live now, and the high-water mark since the last :meth:`reset_peak`."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        for name in ("dstune_counting_live", "dstune_counting_peak"):
            getattr(library, name).restype = ctypes.c_longlong

    @property
    def live(self) -> int:
        """Bytes of CPU tensors allocated since installation and not yet freed."""
        return int(self._lib.dstune_counting_live())

    @property
    def peak(self) -> int:
        """The most :attr:`live` has been since the last :meth:`reset_peak`."""
        return int(self._lib.dstune_counting_peak())

    def reset_peak(self) -> None:
        """Start a new high-water mark from the bytes live now."""
        self._lib.dstune_counting_reset_peak()


def library_path(build_dir: Path) -> Path:
    """Where the shim for this torch build and this source lives (a new source or torch builds a new one)."""
    import torch

    digest = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    return build_dir / f"dstune_counting_allocator_{digest}.so"


def build(target: Path) -> None:
    """Compile the shim into ``target`` (atomically: ranks may build at once); raises ``OSError`` without a
    compiler, ``subprocess.CalledProcessError`` when it fails."""
    import torch

    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise OSError("no C++ compiler (c++, g++ or $CXX) on PATH")
    torch_dir = Path(torch.__file__).parent
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run(
            [
                compiler,
                "-O2",
                "-std=c++17",
                "-shared",
                "-fPIC",
                f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                f"-I{torch_dir / 'include'}",
                str(SOURCE),
                f"-L{torch_dir / 'lib'}",
                "-lc10",
                f"-Wl,-rpath,{torch_dir / 'lib'}",
                "-o",
                str(built),
            ],
            check=True,
            capture_output=True,
        )
        os.replace(built, target)


def counting_allocator(build_dir: Path | None = None) -> CountingAllocator | None:
    """The shim, built if needed and installed as torch's CPU allocator (once per process); None where it cannot
    be built or installed (no compiler, a failed build, another allocator of higher priority)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    from tuner.measure.op_builds import extensions_dir

    target = library_path(build_dir or extensions_dir())
    try:
        if not target.exists():
            build(target)
        library = ctypes.CDLL(str(target))
    except (OSError, subprocess.CalledProcessError):
        return None
    if library.dstune_counting_install() != 1:
        return None
    _loaded = CountingAllocator(library)
    return _loaded
