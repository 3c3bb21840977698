"""One rank's training: build the model where it trains, ``deepspeed.initialize``, warm up, time the steps.

:class:`TrainingProcess` runs the phases in order and times each (``imports_s``, ``distributed_s``, ``model_s``,
``initialize_s``, ``warmup_s``, ``timed_s``); it feeds synthetic token batches, probes memory on one warm-up step
(:mod:`tuner.measure.rank.memory_probe`) and records the true peak (:mod:`tuner.measure.rank.true_peak`). Failures are
classified from exception types (:func:`classify`): every out-of-memory :mod:`tuner.measure.oom` knows (the caching
allocator's, NCCL's, cuBLAS', the CUDA runtime's, the CPU allocator's, ``MemoryError``) is ``oom``; DeepSpeed's
config validation (raised while building its ``DeepSpeedConfig``) is ``invalid_config``; everything else is
``error``.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from tuner.measure.measurement import EXCERPT_CHARS, InvalidConfig, RankResult
from tuner.measure.oom import oom_error
from tuner.measure.op_builds import extensions_dir
from tuner.measure.rank.adam_choice import adam_fallback, with_torch_adam
from tuner.measure.rank.alloc_conf import apply_alloc_conf
from tuner.measure.rank.numerics import NumericsRecorder
from tuner.measure.rank.settling import agree_settled, settled
from tuner.measure.rank.stale_builds import clear_stale_builds
from tuner.measure.rank.trained_model import long_context_model, rank_batches, trained_model
from tuner.measure.run_protocol import RunSpec, progress_path, timings_path, write_json_atomically
from tuner.workload import Workload
from tuner.workload.layouts import AUTOEP

STALE_BUILD_LOCK_S = 900.0  # DeepSpeed's ops compile in about a minute; an older lock outlived a killed build
# DeepSpeed's global timers (deepspeed.runtime.engine's FORWARD/BACKWARD/STEP_GLOBAL_TIMER) by the name we report
BREAKDOWN_TIMERS = {"forward_s": "fwd", "backward_s": "bwd", "step_s": "step"}


def clear_stale_build_locks(max_age_s: float = STALE_BUILD_LOCK_S) -> list[Path]:
    """Remove torch extension builds left half-done by a killed build (a run stopped at its timeout).

    torch waits for such a build's lock to disappear, forever: without this, every later run would hang until its
    timeout. The op's whole build folder goes with the lock, so the next run builds it again from scratch.
    """
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    removed = []
    now = time.time()
    for lock in list(root.glob("**/lock")):
        try:
            if now - lock.stat().st_mtime > max_age_s:
                shutil.rmtree(lock.parent, ignore_errors=True)
                removed.append(lock)
        except FileNotFoundError:
            continue
    return removed


def classify(error: BaseException) -> str:
    """Status for an exception raised inside a rank (every kind of out-of-memory: :mod:`tuner.measure.oom`)."""
    if isinstance(error, InvalidConfig):
        return "invalid_config"
    seen: BaseException | None = error
    for _ in range(8):  # DeepSpeed and torch wrap a CUDA or NCCL failure: its cause says what it was
        if seen is None:
            break
        if isinstance(seen, MemoryError) or oom_error(type(seen).__name__, str(seen)):
            return "oom"
        seen = seen.__cause__ or seen.__context__
    return "error"


def excerpt(error: BaseException) -> str:
    """The exception and the innermost frames of its traceback, trimmed to a readable size."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return text[-EXCERPT_CHARS:]


class Terminated(BaseException):
    """SIGTERM from the launcher (timeout, failed peer, cancelled study), raised so the rank unwinds: ``finally``
    blocks run, and torch's extension build lock is released instead of left behind for every later run."""


class TrainingProcess:
    """One rank's DeepSpeed engine on synthetic data, with timing and memory accounting."""

    def __init__(self, spec: RunSpec, rank: int, run_dir: Path) -> None:
        from tuner.measure.rank.true_peak import CpuAllocatorPeak

        self.spec, self.rank, self.run_dir = spec, rank, run_dir
        self.result = RankResult(rank=rank, status="ok")
        self.allocator = CpuAllocatorPeak(detail=spec.extra.get("allocation_detail") or False)
        self.steps_done = 0  # optimizer steps finished, warm-up included (the allocator's marks name them)
        self.numerics = NumericsRecorder(spec.trial)

    def run(self) -> RankResult:
        """Initialise, warm up, time the steps; never raises (failures land in the result)."""
        started = time.perf_counter()
        try:
            self._run(started)
        except Terminated:
            raise  # the launcher stopped this rank: it says why, not this process
        except BaseException as error:  # every failure is reported, then the process exits non-zero
            self.result.failed_at = time.time()
            self.result.status = classify(error)
            self.result.exception_type = f"{type(error).__module__}.{type(error).__qualname__}"
            self.result.error = excerpt(error)
        self._memory_peaks()
        return self.result

    def _run(self, started: float) -> None:
        import torch

        from tuner.workload import workload_from_dict

        spec, timings = self.spec, self.result.timings
        workload = workload_from_dict(spec.workload)
        self._start_up(started)
        clear_stale_builds(extensions_dir())  # a build killed midway: its lock and compilers, before ops load
        cuda = spec.device == "cuda"
        self._use_device(cuda)
        self._join_process_group(cuda)
        self._validate_config(spec.trial.deepspeed_config(workload.cluster.world_size))
        torch.manual_seed(0)
        if spec.true_peak and not cuda:  # from before the model exists: every tensor the run allocates is seen
            self.allocator.start()
        engine = self._engine(workload, cuda)
        batches = self._batches(engine, workload, cuda)
        begin = time.perf_counter()
        self._warm_up(engine, batches, cuda)
        timings["warmup_s"] = time.perf_counter() - begin
        begin = time.perf_counter()
        self._stop_allocator()
        timings["peak_readback_s"] = time.perf_counter() - begin
        partial = {"timings": dict(timings), "launch": self.result.launch}
        write_json_atomically(timings_path(self.run_dir, self.rank), partial)
        begin = time.perf_counter()
        self._timed_steps(engine, batches, cuda)
        timings["timed_s"] = time.perf_counter() - begin
        if spec.profiler_overhead and not cuda and self.result.step_times:
            self._profiler_overhead(engine, batches)
        self.result.numerics = self.numerics.numerics()  # a collective: every rank gets the same figures
        torch.distributed.barrier()

    def _start_up(self, started: float) -> None:
        """The ``imports_s`` phase, from ``started``: import the training stack (a fresh rank's imports are this
        phase), clear stale build locks and, in a lean run, cache the CPU's description and freeze the imports."""
        for module in ("deepspeed", "torch", "tuner.measure.rank.birth"):
            importlib.import_module(module)
        clear_stale_build_locks()
        if self.spec.lean:
            from tuner.measure.rank.lean import cache_cpu_info, freeze_imports

            cache_cpu_info()
            freeze_imports()
        self.result.timings["imports_s"] = time.perf_counter() - started

    def _use_device(self, cuda: bool) -> None:
        """Bind the rank's cores and set its threads (:mod:`tuner.measure.rank.launch_env`), then pick its GPU (the
        ds_config's allocator settings first)."""
        import torch

        from tuner.measure.rank.launch_env import apply_launch

        self.result.launch = apply_launch()
        if cuda:
            apply_alloc_conf(self.spec.ds_config)
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            self.result.device_name = torch.cuda.get_device_name()

    def _join_process_group(self, cuda: bool) -> None:
        """The ``distributed_s`` phase: DeepSpeed's process group over the launcher's torchrun environment."""
        from datetime import timedelta

        import deepspeed

        from tuner.measure.rank.group_timeout import every_group_times_out

        begin = time.perf_counter()
        timeout = timedelta(seconds=self.spec.collective_timeout_s)
        every_group_times_out(timeout)  # ZeRO's cloned world group, the SP/TP/EP/hpZ groups: not torch's 10 minutes
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", timeout=timeout)
        self.result.timings["distributed_s"] = time.perf_counter() - begin

    def _engine(self, workload: Workload, cuda: bool) -> Any:
        """The ``model_s`` and ``initialize_s`` phases: the model built where it trains, then DeepSpeed's engine."""
        import deepspeed

        from tuner.measure.rank.birth import rss_bytes

        spec, timings = self.spec, self.result.timings
        begin = time.perf_counter()
        model = trained_model(spec, workload, self.result)
        model, self.shard = long_context_model(spec.trial, workload, model, self.result)
        timings["model_s"] = time.perf_counter() - begin
        begin = time.perf_counter()
        config = spec.trial.deepspeed_config(workload.cluster.world_size)
        fallback = adam_fallback(spec.device, config)  # no compiler for DeepSpeed's fused op: torch's Adam trains
        if fallback:
            config, self.result.launch["adam"] = with_torch_adam(config), f"torch (fallback: {fallback})"
        if spec.trial.layout.degree(AUTOEP) > 1:  # AutoEP must find the MoE blocks in the wrapper (.autoep)
            from tuner.measure.rank.layouts.autoep import expose_moe_layers

            config = expose_moe_layers(model, config)
        if spec.wall_clock_breakdown:  # DeepSpeed's forward / backward / step timers (:meth:`_add_breakdown`)
            config["wall_clock_breakdown"] = True
        # only what trains, as the HF Trainer's optimizer takes it: frozen weights get no gradients, masters or states
        trained = [param for param in model.parameters() if param.requires_grad]
        engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, config=config, mpu=self.shard.mpu)
        timings["initialize_s"] = time.perf_counter() - begin
        from tuner.measure.rank.layouts.autotp import local_elements

        self.result.local_params = local_elements(engine.module)
        self.result.rss_bytes["after_initialize"] = rss_bytes()
        return engine

    def _batches(self, engine: Any, workload: Workload, cuda: bool) -> list[Any]:
        """One token batch per micro-step of an optimizer step (the same every step): this rank's share of the
        workload's seeded global batch (:func:`tuner.measure.rank.numerics.seeded_batches`); under Ulysses each rank
        keeps its share of its group's sample (:func:`rank_batches`)."""
        from tuner.measure.rank.numerics import feeder_of, seeded_batches

        feeder = feeder_of(self.rank, workload.cluster.world_size, self.spec.trial)
        micro, accum = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
        seeded = seeded_batches(workload.model, workload.train.seq_len, micro, accum, feeder, "cpu")
        device = engine.device if cuda else "cpu"
        return rank_batches(self.spec.trial, workload, self.shard, seeded, device, self.result)

    def _timed_steps(self, engine: Any, batches: list[Any], cuda: bool) -> None:
        """``spec.steps`` timed optimizer steps, each appended to the progress file the launcher reads."""
        import torch

        steps = self.spec.steps
        progress = progress_path(self.run_dir, self.rank)
        for _ in range(steps):
            if cuda:
                torch.cuda.synchronize()
            tick = time.perf_counter()
            self._train_step(engine, batches)
            if cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - tick
            self._add_breakdown(engine, steps)
            self.result.step_times.append(elapsed)
            with progress.open("a") as sink:  # the launcher reads finished lines while the run goes on
                sink.write(f"{elapsed!r}\n")

    def _stop_allocator(self) -> None:
        """Stop recording allocations (if recording) and report the true peak with the OS high-water mark."""
        from tuner.measure.rank.true_peak import os_high_water

        if not self.allocator.running:
            return
        report = self.allocator.stop()
        report["profiled_steps"] = self.steps_done
        self.result.true_peak_bytes = report.pop("peak_bytes")
        source = report.pop("peak_source")
        self.result.true_peak.update(report, source=source, **os_high_water())

    def _profiler_overhead(self, engine: Any, batches: list[Any]) -> None:
        """One more step under the true-peak tracker: its time against the median timed step is the overhead the
        instrument adds to a step while on (its start and analysis included)."""
        from tuner.measure.measurement import percentile
        from tuner.measure.rank.true_peak import CpuAllocatorPeak

        tracker = CpuAllocatorPeak()
        tick = time.perf_counter()
        tracker.start()
        self._train_step(engine, batches)
        tracker.stop()
        profiled = time.perf_counter() - tick
        plain = percentile(self.result.step_times, 0.5)
        self.result.true_peak["profiled_step_s"] = profiled
        self.result.true_peak["step_overhead_s"] = profiled - plain
        self.result.true_peak["step_overhead"] = profiled / plain - 1 if plain > 0 else None

    def _warm_up(self, engine: Any, batches: list[Any], cuda: bool) -> None:
        """``spec.warmup`` steps, then more until the last ``settle_steps`` agree, up to ``warmup_max`` in all.

        CPU memory is probed on step ``warmup - 1`` (from the second step on, once Adam's states exist); the probe's
        hooks slow that step, so it never counts towards settling. The ranks decide together (an all-reduce per
        extra step), so that they keep running the same number of steps.
        """
        import torch

        spec = self.spec
        limit = max(spec.warmup, spec.warmup_max or spec.warmup)
        probe_step = spec.warmup - 1 if spec.probe_memory and not cuda and spec.warmup >= 2 else -1
        times: list[float] = []
        step = 0
        while step < limit:
            if step >= spec.warmup and agree_settled(settled(times, spec.settle_steps, spec.settle_tolerance), cuda):
                break
            if cuda:
                torch.cuda.synchronize()
            tick = time.perf_counter()
            self._train_step(engine, batches, probe=step == probe_step)
            if cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - tick
            if step != probe_step:
                times.append(elapsed)
            part = "warmup_probe_s" if step == probe_step else "warmup_first_s" if step == 0 else ""
            if part:
                self.result.timings[part] = elapsed
            step += 1
        self.result.warmup_steps = step

    def _add_breakdown(self, engine: Any, steps: int) -> None:
        """Add one timed step's share of DeepSpeed's forward / backward / step time to the per-step means.

        DeepSpeed logs and resets its global timers at every accumulation boundary, after caching them
        (``get_wall_clock_timers``, milliseconds): read right after a step, the cache holds that step's totals.
        """
        if not engine.wall_clock_breakdown():
            return
        cache = engine.get_wall_clock_timers()
        for key, name in BREAKDOWN_TIMERS.items():
            if name in cache:
                self.result.breakdown[key] = self.result.breakdown.get(key, 0.0) + cache[name] / 1000.0 / steps

    @staticmethod
    def _validate_config(ds_config: dict[str, Any]) -> None:
        """Let DeepSpeed's own config classes judge the config before any model is built."""
        from deepspeed.runtime.config import DeepSpeedConfig

        try:
            DeepSpeedConfig(json.loads(json.dumps(ds_config)))
        except Exception as error:  # pydantic ValidationError, AssertionError, ValueError: DeepSpeed's verdicts
            raise InvalidConfig(f"{type(error).__name__}: {error}") from error

    def _train_step(self, engine: Any, batches: list[Any], probe: bool = False) -> None:
        """One optimizer step: a forward and backward per micro-batch, then DeepSpeed's step at the boundary."""
        recorder = None
        if self.allocator.running:  # garbage of the last step's reference cycles would add to this one's peak
            tick = time.perf_counter()
            gc.collect()
            self._add_time("warmup_gc_s", tick)
        if probe:
            from tuner.measure.rank.memory_probe import PhaseRecorder

            recorder = PhaseRecorder(engine)
        mark = self.allocator.mark if self.allocator.running else None
        numerics = self.numerics
        numerics.start_step(engine)
        for index, (tokens, targets) in enumerate(batches):
            if recorder is not None and index == len(batches) - 1:
                recorder.train_step(tokens, targets, mark=mark, step=self.steps_done, loss_hook=numerics.backward_loss)
                continue
            if mark:
                mark(f"step {self.steps_done} micro {index} forward")
            loss = numerics.backward_loss(engine(tokens, targets))
            if mark:
                mark(f"step {self.steps_done} micro {index} backward")
            engine.backward(loss)
            if mark:
                mark(f"step {self.steps_done} micro {index} step")
            if index == len(batches) - 1:
                tick = time.perf_counter()
                numerics.before_step(engine)
                self._add_time("numerics_s", tick)
            engine.step()
        tick = time.perf_counter()
        numerics.after_step(engine)
        self._add_time("numerics_s", tick)
        self.steps_done += 1
        if recorder is not None:
            self.result.timings["probe_sweeps_s"] = recorder.sweeps_s
            self.result.snapshots = recorder.snapshots
            self.result.activation_bytes = recorder.activation_bytes
            self.result.model_state_bytes = max(
                sum(v for k, v in snapshot.items() if k != "other") for snapshot in recorder.snapshots.values()
            )

    def _add_time(self, part: str, since: float) -> None:
        """Add the seconds since ``since`` to the timing ``part`` (a part of a phase: :data:`WARMUP_PARTS`)."""
        self.result.timings[part] = self.result.timings.get(part, 0.0) + time.perf_counter() - since

    def _memory_peaks(self) -> None:
        """The run's high-water marks: the allocator's (a run that failed mid-warm-up reports its peak so far), the
        OS's, and on CUDA the caching allocator's and NVML's."""
        import resource

        self._stop_allocator()
        self.result.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if self.spec.device == "cuda":
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                from tuner.measure.rank.true_peak import cuda_peaks, os_high_water

                peaks = cuda_peaks()
                self.result.peak_allocated = self.result.true_peak_bytes = peaks.pop("peak_bytes")
                self.result.peak_reserved = peaks["max_reserved_bytes"]
                self.result.true_peak.update(peaks, source="cuda", **os_high_water())
