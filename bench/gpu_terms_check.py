"""On one GPU: the estimate's CUDA terms against the allocator's and the driver's own records, and predicted against
measured throughput, for about 20 configs, within a time budget (``bench/gpu_validation.sh`` calls it).

Per config, one measured run (real DeepSpeed, one rank, built-in model, torch's AdamW so no op is compiled):

* the true peak: ``torch.cuda.max_memory_allocated`` against the estimate's tensors plus the cuBLAS workspaces (they
  come from the caching allocator), and ``torch.cuda.max_memory_reserved`` against that plus the simulated
  ``allocator_reserve``;
* the driver's view: the rank's peak process memory from NVML (``nvidia-smi --query-compute-apps``, sampled every
  0.2 s while the run goes on) minus ``max_memory_reserved``, against the estimate's non-allocator terms
  (``cuda_context``; NCCL terms are zero with one rank: one GPU cannot check them);
* throughput: measured tokens/s against :func:`tuner.estimator.throughput.prediction.predict` for the rank's device.

Independent truth: the allocator's records and NVML, not the estimator. ``--dry-run`` (any machine): the config list,
estimates and predictions and the report writer, with the measured columns empty.

Run: ``python3 bench/gpu_terms_check.py --out DIR [--budget-s 400] [--dry-run | --cpu-smoke]``; writes
``DIR/gpu_terms_check.md`` and ``DIR/gpu_terms_check.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.estimator import MemoryEstimate, Overhead, estimate, predict
from tuner.estimator.runtime.device import device_kind
from tuner.measure.options import MeasureOptions
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

MiB = 2**20
H200_MEMORY = 143_771 * MiB
CARD = {"bytes": H200_MEMORY}  # the card the cases are estimated for (bench/gpu_validation.py sets the device's)


@dataclass(frozen=True)
class Case:
    """One config: model, ZeRO stage, micro-batch, precision, checkpointing, sequence, allocator setting."""

    model: str
    stage: int
    micro: int
    precision: str = "bf16"
    checkpointing: bool = False
    seq_len: int = 1024
    expandable: bool = False
    device: str = "cuda"

    @property
    def name(self) -> str:
        flags = (" ckpt" if self.checkpointing else "") + (" expandable" if self.expandable else "")
        return f"{self.model} z{self.stage} mb{self.micro} {self.precision} s{self.seq_len}{flags}"

    def workload(self) -> Workload:
        train = TrainSpec(seq_len=self.seq_len, precision=self.precision)
        cluster = ClusterSpec(gpus_per_node=1, gpu_memory=CARD["bytes"], device=self.device)  # type: ignore[arg-type]
        return Workload(load_builtin_model(self.model), cluster, train)

    def trial(self) -> TrialConfig:
        """The trial config of this case: its ds_config and checkpointing."""
        return TrialConfig(self.ds_config(), self.checkpointing)

    def ds_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": self.micro,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": self.stage},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        }
        if self.precision != "fp32":
            config[self.precision] = {"enabled": True}
        if self.expandable:
            config["dstune"] = {"expandable_segments": True}
        return config


def stage_cases(card_bytes: int, cpu: bool) -> list[Case]:
    """ZeRO-0..3 on a model sized to the card: qwen2-1.5b (24 GB of states in bf16 at one rank) from 40 GB, else
    gpt2; on CPU (a dry run) the tiny LLaMA at stages 0 and 3."""
    if cpu:
        return [Case("tiny-llama", stage, 2, precision="fp32", seq_len=64, device="cpu") for stage in (0, 3)]
    model = "qwen2-1.5b" if card_bytes >= 40 * 2**30 else "gpt2"
    return [Case(model, stage, 4) for stage in (0, 1, 2, 3)]


def cases() -> list[Case]:
    """About 20 configs, most informative first (the budget may stop the list early)."""
    first = [Case("qwen2-1.5b", stage, 4) for stage in (0, 1, 2, 3)]
    first += [Case("qwen2-1.5b", stage, 4, expandable=True) for stage in (0, 2, 3)]
    first += [Case("qwen2-1.5b", stage, 8, checkpointing=True) for stage in (2, 3)]
    first += [Case("qwen2-1.5b", 2, 8, checkpointing=True, expandable=True)]
    first += [Case("gpt2", 2, 4, precision="fp32", seq_len=1000)]  # memory-efficient attention, padded lse
    first += [Case("gpt2", stage, 8) for stage in (0, 2, 3)]
    first += [Case("gpt2", 0, 16, expandable=True), Case("gpt2", 2, 16, checkpointing=True)]
    first += [Case("qwen2-1.5b", 0, 8, seq_len=2048), Case("qwen2-1.5b", 3, 2, precision="fp32")]
    first += [Case("gpt2", 1, 8), Case("qwen2-1.5b", 1, 4, expandable=True)]
    return first


class NvmlSampler:
    """Peak GPU memory of compute processes, from ``nvidia-smi`` every ``interval`` seconds (None without one)."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.peak = interval, None if shutil.which("nvidia-smi") is None else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> NvmlSampler:
        if self.peak is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                lines = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout.splitlines()
                used = sum(int(line.split(",")[1]) for line in lines if line.strip()) * MiB
                self.peak = max(self.peak or 0, used)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.interval)


@dataclass
class Row:
    """One config's estimate and, when run, what was measured (bytes, tokens/s)."""

    case: Case
    estimate: MemoryEstimate
    predicted_tokens_s: float
    status: str = "not run"
    device_name: str | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    nvml_peak: int | None = None
    tokens_s: float | None = None
    seconds: float = 0.0
    error: str = ""
    terms: dict[str, int] = field(default_factory=dict)
    measured_phases: dict[str, int] = field(default_factory=dict)  # live bytes at the end of each phase (the rank's)

    @property
    def tensors(self) -> int:
        """The estimate's tensor peak (overhead excluded)."""
        return int(self.estimate.per_gpu["total"] or 0) - int(self.estimate.per_gpu["overhead"] or 0)

    @property
    def expected_allocated(self) -> int:
        return self.tensors + self.terms.get("cublas_workspace", 0)

    @property
    def expected_reserved(self) -> int:
        return self.expected_allocated + self.terms.get("allocator_reserve", 0)

    @property
    def expected_outside(self) -> int:
        """Terms outside the caching allocator: the context and NCCL."""
        return sum(v for k, v in self.terms.items() if k == "cuda_context" or k.startswith("nccl_"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.case.name,
            "status": self.status,
            "device_name": self.device_name,
            "estimate_tensors": self.tensors,
            "estimate_terms": self.terms,
            "expected_allocated": self.expected_allocated,
            "expected_reserved": self.expected_reserved,
            "peak_allocated": self.peak_allocated,
            "peak_reserved": self.peak_reserved,
            "nvml_peak": self.nvml_peak,
            "predicted_tokens_s": self.predicted_tokens_s,
            "tokens_s": self.tokens_s,
            "seconds": round(self.seconds, 1),
            "error": self.error,
            "phases": {
                name: {"estimated": phase.gpu_total, "measured": self.measured_phases.get(name)}
                for name, phase in self.estimate.phases.items()
            },
            "peak_phase": self.estimate.peak_phase,
        }


def judge(case: Case, device_name: str | None) -> Row:
    """The estimate (for the named GPU; an H200 when unknown) and the throughput prediction of one case."""
    work = case.workload()
    est = estimate(work, case.trial(), Overhead(device=device_kind(device_name or "NVIDIA H200")))
    predicted = predict(work, case.trial(), device_name=device_name or "NVIDIA H200").tokens_per_s
    return Row(case, est, predicted, terms=dict(est.overhead_terms))


def measure_row(row: Row, timeout: float) -> Row:
    """Run the case once (one rank, local launcher) while sampling NVML; fill the measured fields."""
    from tuner.measure.run import run_measurement

    started = time.monotonic()
    with NvmlSampler() as nvml:
        run = run_measurement(
            row.case.workload(), row.case.trial(), MeasureOptions("local", warmup=2, steps=4, timeout=timeout)
        )
    row.seconds = time.monotonic() - started
    row.status, row.nvml_peak, row.error = run.status, nvml.peak, (run.error or "")[-300:]
    if run.ranks:
        rank = run.ranks[0]
        row.device_name, row.peak_allocated = rank.device_name, rank.peak_allocated
        row.peak_reserved = rank.peak_reserved
        row.measured_phases = {name: sum(parts.values()) for name, parts in rank.snapshots.items()}
        if rank.device_name:  # re-estimate for the GPU the run saw
            fresh = judge(row.case, rank.device_name)
            row.estimate, row.predicted_tokens_s, row.terms = fresh.estimate, fresh.predicted_tokens_s, fresh.terms
    row.tokens_s = run.tokens_per_s
    return row


def _mib(value: int | None) -> str:
    return "—" if value is None else f"{value / MiB:,.0f}"


def _err(expected: float, measured: float | None) -> str:
    return "—" if not measured else f"{expected / measured - 1:+.1%}"


def report(rows: list[Row], note: str) -> str:
    """The Markdown report: one table for memory, one for the driver's view and throughput, then medians."""
    lines = [
        "# CUDA terms against one GPU's records",
        "",
        note,
        "",
        "Memory (MiB). Expected allocated = estimated tensors + cuBLAS workspaces; expected reserved = that + the",
        "simulated allocator reserve. Truth: `torch.cuda.max_memory_allocated` / `max_memory_reserved`.",
        "",
        "| config | status | tensors | exp. allocated | max allocated | err | exp. reserved | max reserved | err |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case.name} | {r.status} | {_mib(r.tensors)} | {_mib(r.expected_allocated)} | "
            f"{_mib(r.peak_allocated)} | {_err(r.expected_allocated, r.peak_allocated)} | "
            f"{_mib(r.expected_reserved)} | {_mib(r.peak_reserved)} | {_err(r.expected_reserved, r.peak_reserved)} |"
        )
    lines += [
        "",
        "Outside the allocator (MiB): NVML's peak process memory minus `max_memory_reserved`, against the estimate's",
        "`cuda_context` (+ NCCL terms, zero on one rank). Throughput: measured tokens/s against the prediction.",
        "",
        "| config | est. outside | NVML − reserved | err | predicted tok/s | measured tok/s | err | run s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        outside = r.nvml_peak - r.peak_reserved if r.nvml_peak and r.peak_reserved else None
        tokens = f"{r.tokens_s:,.0f}" if r.tokens_s else "—"
        lines.append(
            f"| {r.case.name} | {_mib(r.expected_outside)} | {_mib(outside)} | {_err(r.expected_outside, outside)} | "
            f"{r.predicted_tokens_s:,.0f} | {tokens} | {_err(r.predicted_tokens_s, r.tokens_s)} | {r.seconds:.0f} |"
        )
    alloc = [abs(r.expected_allocated / r.peak_allocated - 1) for r in rows if r.peak_allocated]
    reserved = [abs(r.expected_reserved / r.peak_reserved - 1) for r in rows if r.peak_reserved]
    if alloc:
        lines += [
            "",
            f"Median |error|: allocated {statistics.median(alloc):.1%} (worst {max(alloc):.1%}) over "
            f"{len(alloc)} runs; reserved {statistics.median(reserved):.1%}"
            + (f" (worst {max(reserved):.1%})" if reserved else ""),
        ]
    failed = [r for r in rows if r.status not in ("ok", "not run")]
    for r in failed:
        lines.append(f"- {r.case.name}: {r.status} {r.error}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--budget-s", type=float, default=400.0, help="start no run after this many seconds")
    parser.add_argument("--dry-run", action="store_true", help="estimates and the report only, no run")
    parser.add_argument("--cpu-smoke", action="store_true", help="one tiny CPU run through the whole path (no GPU)")
    args = parser.parse_args()
    started = time.monotonic()
    chosen = [Case("tiny-llama", 2, 2, precision="fp32", seq_len=64, device="cpu")] if args.cpu_smoke else cases()
    rows = [judge(case, None) for case in chosen]
    args.out.mkdir(parents=True, exist_ok=True)
    for index, row in enumerate(rows):
        left = args.budget_s - (time.monotonic() - started)
        if args.dry_run or left < 30:
            continue
        measure_row(row, timeout=min(240.0, left))
        print(json.dumps(row.to_dict()), flush=True)
        _write(args.out, rows, f"Partial: {index + 1} of {len(rows)} configs run so far.")
    ran = sum(r.status != "not run" for r in rows)
    note = (
        "Dry run (no GPU): estimates for an H200 and the report layout only; nothing here is measured."
        if args.dry_run
        else "CPU smoke run: the script's path end to end on a CPU rank (no CUDA terms, no allocator peaks)."
        if args.cpu_smoke
        else f"{ran} of {len(rows)} configs run in {time.monotonic() - started:.0f} s (budget {args.budget_s:.0f} s)."
    )
    _write(args.out, rows, note)


def _write(out: Path, rows: list[Row], note: str) -> None:
    (out / "gpu_terms_check.md").write_text(report(rows, note))
    (out / "gpu_terms_check.json").write_text(json.dumps([r.to_dict() for r in rows], indent=1))


if __name__ == "__main__":
    main()
