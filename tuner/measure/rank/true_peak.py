"""The true peak of one rank: the allocator's own high-water mark, not a snapshot at phase ends.

CPU: every CPU tensor allocation and free is counted at torch's CPU allocator, on every thread
(:mod:`tuner.measure.rank.counting_allocator`, a small C++ shim installed when the tracker starts, before the model is
built): the high-water mark of live tensor bytes, transients included (bucket copies, fp32 conversions, optimizer
temporaries, gloo's all-gather buffers). The marks split the run into phases (``step 1 backward``), each with its
own high-water mark, so the report says in which the peak fell. ``torch.profiler`` (``profile_memory=True``) runs
only when asked for the allocation sites alive at the peak (``detail``), or where the shim cannot be built: it
records the threads it profiles and no others, so a buffer freed on gloo's worker thread stays alive in its sum
(ZeRO-3 on 2 CPU ranks: 2.1-2.4 MiB of a 12 MiB peak). A run asked to (``RunSpec.profiler_overhead``) times one
more step under the tracker and reports what it costs a step. The OS high-water mark (``VmHWM``, ``ru_maxrss``) is
reported beside it: it is what the OOM killer reads, but pages never written do not count, so it can read below
the allocator.

CUDA (written for real clusters; no GPU here): ``torch.cuda.max_memory_allocated`` (the true peak of live tensor
bytes), ``max_memory_reserved`` (what the caching allocator held), a few ``memory_stats`` counters, and the process's
device memory as NVML sees it (context, NCCL, everything outside PyTorch) when ``pynvml`` is importable.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any

from tuner.measure.rank.counting_allocator import CountingAllocator, counting_allocator

# memory_stats() counters worth keeping (the full dict has hundreds of entries)
CUDA_STATS = (
    "allocated_bytes.all.peak",
    "reserved_bytes.all.peak",
    "active_bytes.all.peak",
    "inactive_split_bytes.all.peak",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
)


def os_high_water() -> dict[str, int]:
    """This process's resident high-water mark: ``VmHWM`` (``/proc/self/status``) and ``ru_maxrss``, in bytes."""
    found = {"ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                found["vm_hwm_bytes"] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return found


class CpuAllocatorPeak:
    """Peak of live CPU tensor bytes (the counting allocator's, else the profiler's memory events), with phase marks
    to place the peak.

    >>> import threading, torch
    >>> tracker = CpuAllocatorPeak()
    >>> tracker.start()
    >>> a = torch.empty(1000, dtype=torch.uint8); held = [torch.empty(500, dtype=torch.uint8)]; del a
    >>> tracker.mark("after")
    >>> freer = threading.Thread(target=held.clear); freer.start(); freer.join()  # freed on another thread
    >>> report = tracker.stop()
    >>> report["peak_bytes"] >= 1500, report["live_at_end_bytes"] <= 0, report["peak_during"]
    (True, True, 'start')
    """

    def __init__(self, detail: bool | str = False) -> None:
        self.profiler: Any = None
        self.counter: CountingAllocator | None = None
        # also report what is alive at the peak, by op ("ops") or with Python frames (True, "stack": slow)
        self.detail = detail
        self.marks: list[tuple[int, str]] = []  # (time.time_ns(), what begins then)
        self.baseline = 0  # counted bytes live at start
        self.phase_peaks: list[tuple[str, int]] = []  # (phase, its high-water mark above the baseline)
        self._started = False

    def start(self) -> None:
        """Begin counting allocations (call before the model is built)."""
        self.counter = counting_allocator()
        if self.counter is not None:
            self.baseline = self.counter.live
            self.counter.reset_peak()
        if self.detail or self.counter is None:
            from torch.profiler import ProfilerActivity, profile

            self.profiler = profile(
                activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=self.detail not in (False, "ops")
            )
            self.profiler.__enter__()
        self._started = True
        self.marks.append((time.time_ns(), "start"))

    def mark(self, label: str) -> None:
        """Note that ``label`` (``step 1 backward``) begins now: the report says in which one the peak fell."""
        self._close_phase()
        self.marks.append((time.time_ns(), label))

    def _close_phase(self) -> None:
        if self.counter is not None and self.marks:
            self.phase_peaks.append((self.marks[-1][1], self.counter.peak - self.baseline))
            self.counter.reset_peak()

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._started

    def stop(self) -> dict[str, Any]:
        """Stop recording; the peak, where it fell, and what the analysis cost."""
        begin = time.perf_counter()
        self._close_phase()
        self._started = False
        report: dict[str, Any] = {}
        if self.counter is not None:
            phase, peak = max(self.phase_peaks, key=lambda item: item[1], default=(None, 0))
            report.update(
                peak_bytes=peak,
                live_at_end_bytes=self.counter.live - self.baseline,
                peak_during=phase,
                peak_source="allocator",
            )
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            profiler.__exit__(None, None, None)
            if self.counter is None:
                report.update(self._profiler_peak(profiler), peak_source="profiler")
            if self.detail:
                tree = profiler.profiler.kineto_results.experimental_event_tree()
                report["allocator_total_peak_bytes"] = allocator_total_peak(tree)
                report["live_at_peak"] = live_at_peak(tree)
        report["analysis_s"] = time.perf_counter() - begin
        return report

    def _profiler_peak(self, profiler: Any) -> dict[str, Any]:
        """The peak of the running sum of the profiler's memory events (the profiled threads' only)."""
        events = sorted(
            (event.start_ns(), event.nbytes())
            for event in profiler.profiler.kineto_results.events()
            if _is_cpu_memory_event(event)
        )
        live = peak = peak_ns = 0
        for start_ns, nbytes in events:
            live += nbytes
            if live > peak:
                peak, peak_ns = live, start_ns
        during = [label for at, label in self.marks if at <= peak_ns]
        return {
            "peak_bytes": peak,
            "live_at_end_bytes": live,
            "peak_during": during[-1] if during else None,
            "memory_events": len(events),
        }


def _is_cpu_memory_event(event: Any) -> bool:
    """True for a kineto ``[memory]`` event of the CPU (some op names are not valid UTF-8: they are not memory)."""
    try:
        name = event.name()
    except UnicodeDecodeError:
        return False
    return name == "[memory]" and event.device_type().name == "CPU"


def _where(chain: list[str]) -> str:
    """A readable allocation site: the innermost few Python frames of DeepSpeed, dstune or torch.optim, then the op."""
    keep = ("deepspeed/", "tuner/", "torch/optim/", "torch/nn/modules/", "torch/autograd/", "torch/utils/checkpoint")
    frames = [name for name in chain if name.startswith(("aten::", "c10d::"))][-2:]
    frames = [name.split("site-packages/")[-1] for name in chain if any(k in name for k in keep)][-3:] + frames
    return " > ".join(frames) or (chain[-1] if chain else "?")


def _name(event: Any) -> str:
    try:
        return str(event.name)
    except UnicodeDecodeError:
        return "?"


def allocator_total_peak(tree: list[Any]) -> int:
    """The largest ``total_allocated`` the CPU allocator's reporter stamped on an allocation event (its own running
    count since profiling started, kept under its lock)."""
    peak = 0
    stack = list(tree)
    while stack:
        event = stack.pop()
        kind, fields = event.typed
        if kind.name == "Allocation":
            if fields.device.type == "cpu":
                peak = max(peak, fields.total_allocated)
        else:
            stack.extend(event.children)
    return peak


def live_at_peak(tree: list[Any], top: int = 40) -> list[dict[str, Any]]:
    """The allocations alive at the peak, grouped by where they were made (largest first): from the profiler's event
    tree (each allocation with its address and the ops and Python frames enclosing it)."""
    allocations: list[tuple[int, int, int, str]] = []  # (time, address, bytes, site)

    def walk(events: list[Any], chain: list[str]) -> None:
        for event in events:
            kind, fields = event.typed
            if kind.name == "Allocation":
                if fields.device.type == "cpu":
                    allocations.append((event.start_time_ns, fields.ptr, fields.alloc_size, _where(chain)))
            else:
                walk(event.children, [*chain, _name(event)])

    walk(tree, [])
    allocations.sort(key=lambda item: (item[0], item[2]))  # at one instant frees first, as :meth:`stop` counts
    _, peak_index, _ = _replay(allocations)
    _, _, alive = _replay(allocations[: peak_index + 1])
    sites: dict[str, list[int]] = {}
    for size, site in (entry for held in alive.values() for entry in held):
        entry = sites.setdefault(site, [0, 0])
        entry[0] += size
        entry[1] += 1
    ranked = sorted(sites.items(), key=lambda item: -item[1][0])[:top]
    return [{"bytes": size, "count": count, "site": site} for site, (size, count) in ranked]


def _replay(allocations: list[tuple[int, int, int, str]]) -> tuple[int, int, dict[int, list[tuple[int, str]]]]:
    """Replay allocation records: (peak of live bytes, index of the record that reached it, what is alive at the
    end, by address).

    The profiler records the threads it profiles only: a block freed on another thread (gloo's worker) has no free
    record. The allocator cannot hand out an address that is still in use, so an allocation at an address the books
    hold alive frees the block there; its own free, if recorded later (an address reused at once can carry the new
    allocation stamped first), is then matched to it and ignored, not taken from the new block.
    """
    alive: dict[int, list[tuple[int, str]]] = {}
    freed_unseen: dict[tuple[int, int], int] = {}  # (address, bytes) -> blocks dropped before their free record
    live = peak = peak_index = 0
    for index, (_, address, size, site) in enumerate(allocations):
        held = alive.setdefault(address, [])
        if size > 0:
            for old, _ in held:
                live -= old
                freed_unseen[(address, old)] = freed_unseen.get((address, old), 0) + 1
            held[:] = [(size, site)]
            live += size
        elif freed_unseen.get((address, -size)):
            freed_unseen[(address, -size)] -= 1
        else:
            match = next((i for i, (bytes_, _) in enumerate(held) if bytes_ == -size), None)
            if match is not None:
                del held[match]
                live += size
        if live > peak:
            peak, peak_index = live, index
    return peak, peak_index, alive


def cuda_peaks(device_index: int | None = None) -> dict[str, Any]:
    """The CUDA caching allocator's peaks and counters, plus NVML's view of this process's device memory."""
    import torch

    found: dict[str, Any] = {
        "peak_bytes": torch.cuda.max_memory_allocated(device_index),
        "max_reserved_bytes": torch.cuda.max_memory_reserved(device_index),
    }
    stats = torch.cuda.memory_stats(device_index)
    found["memory_stats"] = {key: int(stats[key]) for key in CUDA_STATS if key in stats}
    nvml = nvml_process_bytes(torch.cuda.current_device() if device_index is None else device_index)
    if nvml is not None:
        found["nvml_process_bytes"] = nvml
    return found


def nvml_process_bytes(device_index: int) -> int | None:
    """Device memory NVML charges to this process on GPU ``device_index`` (None without pynvml or visibility).

    ``device_index`` is torch's; with ``CUDA_VISIBLE_DEVICES`` set it is mapped to the device NVML names: a physical
    index, or a ``GPU-…`` / ``MIG-…`` UUID. In a container NVML lists host PIDs, never this process's own
    (:func:`own_process_bytes`).
    """
    try:
        import pynvml
    except ImportError:
        return None
    visible = [name.strip() for name in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
    name = visible[device_index] if device_index < len(visible) else str(device_index)
    try:
        pynvml.nvmlInit()
        try:
            if name.isdigit():
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(name))
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(name)
            processes = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            return own_process_bytes(processes, os.getpid())
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None


def own_process_bytes(processes: list[tuple[int, int | None]], pid: int) -> int | None:
    """This process's bytes among NVML's ``(pid, used bytes)`` of one device: its own PID's; in a container, where
    NVML lists host PIDs, the one process on the device when there is just one (a rank holds its GPU alone); else
    None.

    >>> own_process_bytes([(41, 2**30)], 41), own_process_bytes([(90211, 2**30)], 41), own_process_bytes([], 41)
    (1073741824, 1073741824, None)
    """
    mine = [used for found, used in processes if found == pid and used is not None]
    if mine:
        return int(mine[0])
    if len(processes) == 1 and processes[0][1] is not None:
        return int(processes[0][1])
    return None
