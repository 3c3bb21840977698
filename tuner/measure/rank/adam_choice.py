"""Which Adam a rank trains with: DeepSpeed's own compiled one where the node has it or can build it, else torch's.

A ds_config's ``Adam``/``AdamW`` makes DeepSpeed load a compiled op (:func:`tuner.measure.op_builds.ops_needed`):
``fused_adam`` on CUDA, built on first use with ``nvcc`` (``CUDA_HOME``), a C++ compiler, ``Python.h`` and ninja;
``cpu_adam`` with optimizer offload, built with a C++ compiler, ``Python.h`` and ninja. On a slim image without them
every trial of the default space failed in ``deepspeed.initialize``, though nobody asked for a fused op. So a rank
whose op is neither prebuilt (``DS_BUILD_FUSED_ADAM=1`` / ``DS_BUILD_CPU_ADAM=1`` at install) nor built already in the
extensions folder, and cannot be built on this node, trains with torch's ``Adam``/``AdamW`` instead (DeepSpeed's
``"torch_adam": true``; with offload torch's optimizer steps on the CPU copy, slower than CPU-Adam's AVX kernels) and
says so in its report (``launch["adam"]``). A node that can build the op builds it, as before; ``deploy/README.md``
says what a node needs for the fused ops.

Example:
    >>> nothing = lambda name: None  # a node with no compiler on its PATH, and no op built in its extensions folder
    >>> bare = {"CUDA_HOME": "/none", "TORCH_EXTENSIONS_DIR": "/none"}
    >>> adam_fallback("cuda", {"optimizer": {"type": "AdamW"}}, env=bare, prebuilt=(), which=nothing)
    'fused_adam is not built and this node lacks nvcc (CUDA_HOME), a C++ compiler (g++), ninja to build it'
"""

from __future__ import annotations

import copy
import os
import shutil
import sysconfig
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from tuner.measure.op_builds import CPU_ADAM, FUSED_ADAM, extensions_dir, missing_ops, ops_needed, prebuilt_ops

Which = Callable[[str], str | None]


def _nvcc(env: Mapping[str, str], which: Which) -> bool:
    """Whether torch's extension builder finds ``nvcc`` (its ``CUDA_HOME`` rule: the variable, then the PATH, then
    ``/usr/local/cuda``)."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        return Path(home, "bin", "nvcc").is_file()
    return bool(which("nvcc")) or Path("/usr/local/cuda/bin/nvcc").is_file()


def toolchain_missing(
    op: str, device: str, env: Mapping[str, str] | None = None, which: Which = shutil.which
) -> list[str]:
    """What this node lacks to build ``op`` for ``device`` (empty: it can)."""
    env = os.environ if env is None else env
    lacking = []
    if op == FUSED_ADAM and device == "cuda" and not _nvcc(env, which):
        lacking.append("nvcc (CUDA_HOME)")
    if not (which("c++") or which("g++")):
        lacking.append("a C++ compiler (g++)")
    if not Path(sysconfig.get_paths()["include"], "Python.h").is_file():
        lacking.append("Python.h (the Python development headers)")
    if not which("ninja"):
        lacking.append("ninja")
    return lacking


def adam_fallback(
    device: str,
    ds_config: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    prebuilt: Collection[str] | None = None,
    which: Which = shutil.which,
) -> str | None:
    """Why a run of ``ds_config`` must train with torch's Adam on this node, or None when DeepSpeed's op loads."""
    ops = [op for op in ops_needed(device, ds_config) if op in (FUSED_ADAM, CPU_ADAM)]
    missing = missing_ops(ops, extensions_dir(env), prebuilt_ops() if prebuilt is None else prebuilt)
    for op in missing:
        lacking = toolchain_missing(op, device, env, which)
        if lacking:
            return f"{op} is not built and this node lacks {', '.join(lacking)} to build it"
    return None


def with_torch_adam(ds_config: Mapping[str, Any]) -> dict[str, Any]:
    """``ds_config`` with DeepSpeed told to build torch's Adam/AdamW (``optimizer.params.torch_adam``)."""
    config = copy.deepcopy(dict(ds_config))
    optimizer = config.setdefault("optimizer", {})
    optimizer["params"] = {**optimizer.get("params", {}), "torch_adam": True}
    return config
