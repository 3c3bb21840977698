"""Start-up and shut-down work a rank can skip without changing what it measures (``RunSpec.lean``).

Measured on the README's study (2 CPU ranks, tiny LLaMA), per rank:

* DeepSpeed's op loader asks py-cpuinfo for the CPU's flags on every op it loads (to name the build), and py-cpuinfo
  answers by running a Python subprocess: about 1.2 s per op on a busy 2-core host, twice per run. The answer cannot
  change while the machine is up, so it is cached per node and boot in ``TORCH_EXTENSIONS_DIR`` (where the ops
  themselves are cached once per node): :func:`cache_cpu_info`.
* The CPU memory probe (:mod:`tuner.measure.rank.memory_probe`) collects garbage before each of its four sweeps; with
  torch, DeepSpeed and torch's compiler stack imported that is 0.6 s each, spent walking module objects that can never
  be garbage. :func:`freeze_imports` imports the lazily loaded compiler stack up front (``torch.optim`` loads it on the
  first optimizer anyway) and moves everything alive after the imports to the collector's permanent generation
  (``gc.freeze``): later collections skip it. The sweeps still see every tensor made after the imports: parameters,
  gradients, optimizer states and activations all are.
* Interpreter teardown of a process holding torch and DeepSpeed takes about 0.6 s; once a rank wrote its result it
  leaves with ``os._exit``.
"""

from __future__ import annotations

import gc
import json
import os
import socket
from pathlib import Path
from typing import Any


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"


def cpu_info_cache_path(root: Path | None = None) -> Path:
    """Where this node's CPU description is cached for this boot."""
    base = root or Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    return base / f"dstune-cpuinfo-{socket.gethostname()}-{_boot_id()}.json"


def cache_cpu_info(root: Path | None = None) -> None:
    """Make ``cpuinfo.get_cpu_info`` answer from a per-node, per-boot file (filled by the first caller)."""
    import cpuinfo  # type: ignore[import-untyped]

    original = getattr(cpuinfo.get_cpu_info, "__wrapped__", cpuinfo.get_cpu_info)
    path = cpu_info_cache_path(root)
    memo: dict[str, Any] = {}

    def get_cpu_info() -> dict[str, Any]:
        if "info" not in memo:
            try:
                memo["info"] = json.loads(path.read_text())
            except (OSError, ValueError):
                memo["info"] = original()
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    partial = path.with_suffix(f".{os.getpid()}.partial")
                    partial.write_text(json.dumps(memo["info"]))
                    os.replace(partial, path)
                except OSError:
                    pass  # a read-only cache folder: this process still answers from memory
        return dict(memo["info"])

    get_cpu_info.__wrapped__ = original  # type: ignore[attr-defined]
    cpuinfo.get_cpu_info = get_cpu_info


def freeze_imports() -> None:
    """Import torch's compiler stack now and move every object alive to the permanent generation (see above)."""
    import torch._dynamo  # noqa: F401  # loaded by the first torch.optim optimizer: here it is frozen with the rest

    gc.collect()
    gc.freeze()
