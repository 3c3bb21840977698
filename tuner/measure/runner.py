"""The short measured run inside one rank's process: ``python -m tuner.measure.runner RUN_DIR RANK``.

A launcher (``tuner.measure.launcher`` or ``tuner.measure.ray_launcher``) writes ``RUN_DIR/spec.json`` (a
:class:`RunSpec`), sets torchrun's environment (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``), and starts one process per rank. Each rank builds the model where
it trains (:mod:`tuner.measure.birth`), feeds synthetic token batches, runs ``deepspeed.initialize``, warm-up steps and
timed steps, and writes ``RUN_DIR/rank-N.json`` (a :class:`tuner.measure.measurement.RankResult`). Failures are
classified from exception types: CUDA out-of-memory, the CPU allocator's failure and ``MemoryError`` are ``oom``;
DeepSpeed's config validation (raised while building its ``DeepSpeedConfig``) is ``invalid_config``; everything else
is ``error``. The runner knows nothing of databases or studies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.measure.measurement import EXCERPT_CHARS, RankResult

CPU_ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"  # torch's CPU allocator has no exception type
STALE_BUILD_LOCK_S = 900.0  # DeepSpeed's ops compile in about a minute; an older lock outlived a killed build


@dataclass
class RunSpec:
    """Everything a rank needs to run: the workload, the ds_config and how long to measure."""

    workload: dict[str, Any]
    ds_config: dict[str, Any]
    device: str = "cpu"
    warmup: int = 1
    steps: int = 3
    model_impl: str = "builtin"
    hf_config: dict[str, Any] | None = None
    collective_timeout_s: float = 120.0
    probe_memory: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def write(self, run_dir: Path) -> None:
        """Write ``spec.json`` into ``run_dir``."""
        (run_dir / "spec.json").write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, run_dir: Path) -> RunSpec:
        """Read ``spec.json`` from ``run_dir``."""
        return cls(**json.loads((run_dir / "spec.json").read_text()))


class InvalidConfig(Exception):
    """DeepSpeed rejected the ds_config (the message is DeepSpeed's own)."""


def result_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its result."""
    return run_dir / f"rank-{rank}.json"


def progress_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes how many steps it finished."""
    return run_dir / f"progress-{rank}"


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that a reader never sees half a file."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)


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
    """Status for an exception raised inside a rank."""
    import torch

    if isinstance(error, InvalidConfig):
        return "invalid_config"
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return "oom"
    if isinstance(error, RuntimeError) and CPU_ALLOCATOR_FAILURE in str(error):
        return "oom"
    return "error"


def excerpt(error: BaseException) -> str:
    """The exception and the innermost frames of its traceback, trimmed to a readable size."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return text[-EXCERPT_CHARS:]


class TrainingProcess:
    """One rank's DeepSpeed engine on synthetic data, with timing and memory accounting."""

    def __init__(self, spec: RunSpec, rank: int, run_dir: Path) -> None:
        self.spec, self.rank, self.run_dir = spec, rank, run_dir
        self.result = RankResult(rank=rank, status="ok")

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
        import deepspeed
        import torch

        from tuner.measure.birth import rss_bytes
        from tuner.workload import workload_from_dict

        spec, timings = self.spec, self.result.timings
        workload = workload_from_dict(spec.workload)
        clear_stale_build_locks()
        timings["imports_s"] = time.perf_counter() - started
        cuda = spec.device == "cuda"
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            self.result.device_name = torch.cuda.get_device_name()
        else:
            torch.set_num_threads(int(os.environ.get("DSTUNE_THREADS_PER_RANK", "1")))
        from datetime import timedelta

        begin = time.perf_counter()
        deepspeed.init_distributed(
            dist_backend="nccl" if cuda else "gloo", timeout=timedelta(seconds=spec.collective_timeout_s)
        )
        timings["distributed_s"] = time.perf_counter() - begin
        self._validate_config(spec.ds_config)
        torch.manual_seed(0)
        model = self._born_model(workload)
        begin = time.perf_counter()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=spec.ds_config)
        timings["initialize_s"] = time.perf_counter() - begin
        self.result.rss_bytes["after_initialize"] = rss_bytes()
        device = engine.device if cuda else "cpu"
        from tuner.measure.models import synthetic_batch

        accum = engine.gradient_accumulation_steps()
        batches = [
            synthetic_batch(
                workload.model,
                engine.train_micro_batch_size_per_gpu(),
                workload.train.seq_len,
                device,
                seed=self.rank * 1000 + i,
            )
            for i in range(accum)
        ]
        begin = time.perf_counter()
        for step in range(spec.warmup):
            # CPU memory is probed on the last warm-up step, once Adam's states exist (so from the second step on).
            probe = spec.probe_memory and not cuda and step == spec.warmup - 1 and step >= 1
            self._train_step(engine, batches, probe=probe)
        timings["warmup_s"] = time.perf_counter() - begin
        begin = time.perf_counter()
        for step in range(spec.steps):
            if cuda:
                torch.cuda.synchronize()
            tick = time.perf_counter()
            self._train_step(engine, batches)
            if cuda:
                torch.cuda.synchronize()
            self.result.step_times.append(time.perf_counter() - tick)
            progress_path(self.run_dir, self.rank).write_text(str(step + 1))
        timings["timed_s"] = time.perf_counter() - begin
        torch.distributed.barrier()

    @staticmethod
    def _validate_config(ds_config: dict[str, Any]) -> None:
        """Let DeepSpeed's own config classes judge the config before any model is built."""
        from deepspeed.runtime.config import DeepSpeedConfig

        try:
            DeepSpeedConfig(json.loads(json.dumps(ds_config)))
        except Exception as error:  # pydantic ValidationError, AssertionError, ValueError: DeepSpeed's verdicts
            raise InvalidConfig(f"{type(error).__name__}: {error}") from error

    def _born_model(self, workload: Any) -> Any:
        """Build the model sharded (ZeRO-3) or on the device in the training dtype (``tuner.measure.birth``),
        recording the resident bytes it added on the host."""
        from tuner.measure.birth import born_on_device, rss_bytes

        rss = self.result.rss_bytes
        rss["before_model"] = rss_bytes()
        transformers = self.spec.model_impl == "transformers" or workload.model.implementation == "transformers"
        with born_on_device(self.spec.ds_config, self.spec.device, transformers):
            model = self._build_model(workload)
        rss["after_model"] = rss_bytes()
        return model

    def _build_model(self, workload: Any) -> Any:
        train = workload.train
        if self.spec.model_impl == "transformers" or workload.model.implementation == "transformers":
            from tuner.measure.models import build_transformers_model

            hf_config = self.spec.hf_config or json.loads(workload.model.hf_config)
            return build_transformers_model(hf_config, train.attention, train.activation_checkpointing)
        from tuner.measure.models import build_model

        return build_model(workload.model, attention=train.attention, checkpointing=train.activation_checkpointing)

    def _train_step(self, engine: Any, batches: list[Any], probe: bool = False) -> None:
        """One optimizer step: a forward and backward per micro-batch, then DeepSpeed's step at the boundary."""
        recorder = None
        if probe:
            from tuner.measure.memory_probe import PhaseRecorder

            recorder = PhaseRecorder(engine)
        for index, (tokens, targets) in enumerate(batches):
            if recorder is not None and index == len(batches) - 1:
                recorder.train_step(tokens, targets)
                continue
            loss = engine(tokens, targets)
            engine.backward(loss)
            engine.step()
        if recorder is not None:
            self.result.snapshots = recorder.snapshots
            self.result.activation_bytes = recorder.activation_bytes
            self.result.model_state_bytes = max(
                sum(v for k, v in snapshot.items() if k != "other") for snapshot in recorder.snapshots.values()
            )

    def _memory_peaks(self) -> None:
        import resource

        self.result.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if self.spec.device == "cuda":
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                self.result.peak_allocated = torch.cuda.max_memory_allocated()
                self.result.peak_reserved = torch.cuda.max_memory_reserved()


class Terminated(BaseException):
    """SIGTERM from the launcher (timeout, failed peer, cancelled study), raised so the rank unwinds: ``finally``
    blocks run, and torch's extension build lock is released instead of left behind for every later run."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank: run, write the result, exit 0 when ok (143 without a result when terminated)."""
    args = argv or sys.argv[1:]
    run_dir, rank = Path(args[0]), int(args[1])
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        result = TrainingProcess(RunSpec.read(run_dir), rank, run_dir).run()
    except Terminated:
        return 128 + signal.SIGTERM
    write_json_atomically(result_path(run_dir, rank), asdict(result))
    if result.status != "ok":
        print(result.error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
