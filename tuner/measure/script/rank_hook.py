"""Inside each process of a measured training command: wrap ``deepspeed.initialize`` and the engine's step, count
memory, and write what this rank measured into the run's folder (``DSTUNE_SCRIPT_RUN``).

Installed at start-up by dstune's ``sitecustomize`` (:mod:`tuner.measure.script`); it imports nothing heavy itself:
when the process imports ``torch`` it starts counting CPU tensor bytes at the allocator
(:mod:`tuner.measure.rank.counting_allocator`, the instrument of the built-in runs), and when it imports ``deepspeed``
it wraps ``deepspeed.initialize`` (the HF Trainer and accelerate call it too). The engine it returns has its ``step``
and ``forward`` wrapped: each optimizer step (``global_steps`` moving) is timed from the end of the one before, data
loading included; after the warm-up the next steps are timed; then the rank writes ``rank-N.json`` (a
:class:`~tuner.measure.measurement.RankResult`), waits for its peers and exits 0, as DeepSpeed's autotuner makes a
rank exit after its profiled steps. An exception that ends the process is written as ``error-PID.json`` with the
phase it ended in (before ``deepspeed.initialize``, inside it, or training) and its last traceback line.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from tuner.measure.script.failures import exception_status

HOOK_FILE = "hook.json"  # the run's warm-up and timed steps, written by the launcher
SETTLE_STEPS, SETTLE_TOLERANCE = 2, 0.1  # the built-in runs' (tuner.measure.run_protocol.RunSpec)


class _State:
    def __init__(self, run_dir: Path) -> None:
        settings = json.loads((run_dir / HOOK_FILE).read_text())
        self.run_dir = run_dir
        self.warmup, self.steps = int(settings["warmup"]), int(settings["steps"])
        # a script that ends by itself after this many timed steps is measured on them (a confirmation's longer run)
        self.steps_at_least = int(settings.get("steps_at_least") or self.steps)
        # past the warm-up, warm up until the step times settle, up to this many warm-up steps (the built-in runs')
        self.warmup_max = max(self.warmup, int(settings.get("warmup_max") or self.warmup))
        self.in_call = bool(settings.get("in_call"))  # the trial's config goes into deepspeed.initialize's call
        self.warm_times: list[float] = []
        self.warm = False  # the warm-up is over
        self.phase = "before_initialize"
        self.counter: Any = None
        self.baseline = 0
        self.phase_peaks: dict[str, int] = {}
        self.started = time.monotonic()
        self.times: dict[str, float] = {}
        self.step_times: list[float] = []
        self.last_step_end = 0.0
        self.seen = {"micro_batches": 0, "samples": 0, "tokens": 0, "longest": 0}
        self.rank: int | None = None
        self.engine: Any = None
        self.done = False

    def mark(self, phase: str) -> None:
        """Close the phase running now (its allocator peak) and begin ``phase``."""
        if self.counter is not None:
            peak = self.counter.peak - self.baseline
            self.phase_peaks[self.phase] = max(self.phase_peaks.get(self.phase, 0), peak)
            self.counter.reset_peak()
        self.phase = phase


_state: _State | None = None


def install() -> None:
    """Watch this process's imports of torch and deepspeed; write an exception that ends it."""
    global _state
    if _state is not None:
        return
    _state = _State(Path(os.environ["DSTUNE_SCRIPT_RUN"]))
    sys.meta_path.insert(0, _AfterImport({"torch": _on_torch, "deepspeed": _on_deepspeed}))
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        _write_error(error)
        previous(kind, error, tb)

    sys.excepthook = excepthook
    atexit.register(_at_exit)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after a watched module has executed (then forgets it)."""

    def __init__(self, callbacks: dict[str, Any]) -> None:
        self.callbacks = callbacks

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        # a spec is also asked for without importing (transformers' and accelerate's availability checks): the
        # callback runs, once, when a module is executed
        if name not in self.callbacks:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            callback = self.callbacks.pop(name, None)
            if callback is not None:
                callback(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _on_torch(torch: ModuleType) -> None:
    assert _state is not None
    try:
        from tuner.measure.rank.counting_allocator import counting_allocator

        _state.counter = counting_allocator()
    except Exception:  # no compiler, another allocator: the run reports its OS high-water mark only
        _state.counter = None
    if _state.counter is not None:
        _state.baseline = _state.counter.live
        _state.counter.reset_peak()


def _on_deepspeed(deepspeed: ModuleType) -> None:
    from tuner.measure.script.zero_init import watch_zero_init

    watch_zero_init(deepspeed)
    original = deepspeed.initialize

    def initialize(*args: Any, **kwargs: Any) -> Any:
        assert _state is not None
        _state.times["before_initialize_s"] = time.monotonic() - _state.started
        _state.mark("initialize")
        began = time.monotonic()
        if _state.in_call:
            from tuner.measure.script.in_call import decisions_of, merged_call

            args, kwargs, _ = merged_call(original, args, kwargs, decisions_of(_state.run_dir))
        result = original(*args, **kwargs)
        _state.times["initialize_s"] = time.monotonic() - began
        engine = result[0]
        _attach(engine)
        return result

    initialize.__doc__ = original.__doc__
    deepspeed.initialize = initialize  # type: ignore[attr-defined]


def _attach(engine: Any) -> None:
    """Time ``engine``'s optimizer steps and count what its forward sees."""
    import torch.distributed as dist

    assert _state is not None
    state = _state
    state.engine = engine
    state.rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    _write(state.run_dir / f"init-{state.rank}", {"pid": os.getpid(), **_engine_facts(engine)})
    state.mark("step 1")
    state.last_step_end = time.monotonic()
    step, forward = engine.step, engine.forward

    def counted_forward(*args: Any, **kwargs: Any) -> Any:
        _count_inputs(args, kwargs)
        return forward(*args, **kwargs)

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        before = engine.global_steps
        result = step(*args, **kwargs)
        if engine.global_steps != before:
            _stepped()
        return result

    engine.forward, engine.step = counted_forward, timed_step


def _count_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    import torch

    assert _state is not None
    first = next((v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)), None)
    if first is None or first.dim() == 0:
        return
    seen = _state.seen
    seen["micro_batches"] += 1
    seen["samples"] += int(first.shape[0])
    ids = kwargs.get("input_ids", first)
    if isinstance(ids, torch.Tensor) and not ids.is_floating_point() and ids.dim() == 2:
        seen["tokens"] += int(ids.numel())
        seen["longest"] = max(seen["longest"], int(ids.shape[1]))


def _stepped() -> None:
    """An optimizer step ended: time it; after the warm-up and timed steps, report and exit."""
    assert _state is not None
    state = _state
    now = time.monotonic()
    elapsed, state.last_step_end = now - state.last_step_end, now
    warm = int(state.times.get("warmup_done", 0))
    if warm < state.warmup or (warm < state.warmup_max and not state.warm):
        done = warm + 1
        state.times["warmup_done"] = done
        state.times["warmup_s"] = state.times.get("warmup_s", 0.0) + elapsed
        state.warm_times.append(elapsed)
        # warm after --warmup steps, or past them once the step times settle, at most --warmup-max
        state.warm = done >= state.warmup_max or (done >= state.warmup and _settled(state.warm_times))
        if state.warm:
            state.seen = dict.fromkeys(state.seen, 0)  # count the timed steps' inputs only
        state.mark("timed steps" if state.warm else f"step {done + 1}")
        return
    state.step_times.append(elapsed)
    with (state.run_dir / f"progress-{state.rank}").open("a") as sink:
        sink.write(f"{elapsed}\n")
    if len(state.step_times) >= state.steps:
        _finish()


def _settled(times: list[float]) -> bool:
    """Whether the warm-up's step times settled, as the built-in runs decide it (:mod:`tuner.measure.rank.settling`):
    every rank together (an all-reduce), so that the ranks time the same steps."""
    import torch.distributed as dist

    from tuner.measure.rank.settling import agree_settled, settled

    mine = settled(times, SETTLE_STEPS, SETTLE_TOLERANCE)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    return agree_settled(mine, dist.get_backend() == "nccl")


def _memory() -> dict[str, Any]:
    from tuner.measure.rank.true_peak import cuda_peaks, os_high_water

    assert _state is not None
    import torch

    report: dict[str, Any] = dict(os_high_water())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        report.update(cuda_peaks(), peak_source="cuda")
        return report
    _state.mark("end")
    if _state.phase_peaks:
        phase, peak = max(_state.phase_peaks.items(), key=lambda item: item[1])
        report.update(peak_bytes=peak, peak_during=phase, peak_source="allocator", phase_peaks=_state.phase_peaks)
    return report


def _result(status: str, error: str | None = None, kind: str | None = None) -> dict[str, Any]:
    from tuner.measure.measurement import RankResult

    assert _state is not None
    state, engine = _state, _state.engine
    memory = _memory()
    result = RankResult(rank=state.rank or 0, status=status, exception_type=kind, error=error)
    result.step_times = list(state.step_times)
    result.warmup_steps = int(state.times.get("warmup_done", 0))
    result.true_peak = memory
    result.true_peak_bytes = memory.get("peak_bytes")
    if memory.get("peak_source") == "cuda":
        result.peak_allocated, result.peak_reserved = memory["peak_bytes"], memory.get("max_reserved_bytes")
    result.peak_rss_bytes = memory.get("vm_hwm_bytes")
    result.timings = {k: v for k, v in state.times.items() if k.endswith("_s")}
    result.timings["timed_s"] = sum(state.step_times)
    result.script = {"seen": dict(state.seen), **_engine_facts(engine), "code_paths": _code_paths(engine)}
    return result.to_dict()


def _code_paths(engine: Any) -> dict[str, bool] | None:
    """Whether the engine's model ran DeepSpeed's chunked loss and Liger's kernels (None: its model did not read)."""
    from tuner.measure.script.code_paths import code_paths

    try:
        return code_paths(engine.module)
    except Exception:  # an odd model: the run's figures stand without it
        return None


def _engine_facts(engine: Any) -> dict[str, int]:
    """The batch and layout DeepSpeed's engine trains with."""
    return {
        "train_batch_size": int(engine.train_batch_size()),
        "micro_batch": int(engine.train_micro_batch_size_per_gpu()),
        "accumulation": int(engine.gradient_accumulation_steps()),
        "world_size": int(engine.world_size),
        "zero_stage": int(engine.zero_optimization_stage()),
    }


def _finish() -> None:
    """Write this rank's result, wait for the peers, exit 0 (the rest of the script is not measured)."""
    assert _state is not None
    _state.done = True
    data = _result("ok")
    _write(_state.run_dir / f"rank-{_state.rank}.json", data)
    import torch.distributed as dist

    if dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _write(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)


def _write_error(error: BaseException) -> None:
    assert _state is not None
    lines = traceback.format_exception_only(type(error), error)
    last = lines[-1].strip() if lines else type(error).__name__
    from tuner.measure.script.zero_init import phase_of

    phase = phase_of(error, _state.phase)
    status = exception_status(error, phase)
    record = {
        "pid": os.getpid(),
        "rank": _state.rank if _state.rank is not None else os.environ.get("RANK"),
        "phase": phase,
        "status": status,
        "exception_type": type(error).__name__,
        "line": last,
        "at": time.time(),
    }
    _write(_state.run_dir / f"error-{os.getpid()}.json", record)
    _state.done = True  # its error record says how it ended


def _at_exit() -> None:
    """A process that trained but ended before its timed steps (a short epoch, its own exit) says so."""
    state = _state
    if state is None or state.engine is None or state.done:
        return
    state.done = True
    if len(state.step_times) >= state.steps_at_least:
        _write(state.run_dir / f"rank-{state.rank}.json", _result("ok"))
        return
    done = int(state.times.get("warmup_done", 0)) + len(state.step_times)
    why = (
        f"the script ended after {done} optimizer steps, before {state.warmup} warm-up and {state.steps} timed steps: "
        "give it more data or steps, or measure fewer (--warmup, --steps)"
    )
    _write(state.run_dir / f"rank-{state.rank}.json", _result("error", why, "ScriptEndedEarly"))
