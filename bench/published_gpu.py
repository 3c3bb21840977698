"""``dstune estimate`` scored against published GPU training runs (``bench/data/published_gpu.yaml``): for each row,
the estimate of the published config on its GPU type, the fits/out-of-memory verdict against the published outcome,
and, where the source gives a memory figure, the error per kind of figure (allocated, reserved, nvidia-smi,
unspecified).

How a row becomes an estimate (what the sources leave implicit is decided here, once):

* The model is ``bench/configs/<model>/config.json`` or ``bench/configs/<model>.json`` when it exists (the
  transformers model, traced), else a preset; GPT-2 configs of Megatron-LM's shape use dstune's built-in GPT-2
  (``--model-impl builtin``). A row's ``optimizer``, ``bf16_master_weights``, ``bf16_optimizer_states`` and
  ``attention`` are the flags of those names; its ``zero`` keys go to ``zero_optimization``, and ``torch_autocast``
  (a dtype) enables DeepSpeed's ``torch_autocast`` section with it.
* ALST's tiling as ArcticTraining runs it: a tiled MLP in ``ceil(s/sp / hidden)`` shards (DeepSpeed's ALST
  tutorial). A row whose note says ``model type liger`` (ArcticTraining's Liger-Kernel model: fused RMSNorm, SwiGLU,
  RoPE and linear cross-entropy) is estimated with ``--liger`` (:mod:`tuner.estimator.activations.liger`);
  ``--no-liger`` scores such rows as before, Liger's loss as a tiled loss whose shards hold at most 1 GiB of fp32
  logits and the layers as Hugging Face's.
* ArcticTraining trains with activation checkpointing (its checkpoint offload needs it).
* A figure in ``GB`` from DeepSpeed's or ArcticTraining's memory logs is read as 2**30 bytes (their
  ``see_memory_usage`` divides by 1024**3).

The verdict is the GPU side's (what this bench scores); the host side is reported beside it (``cpu short``: the
node's CPU memory does not hold the estimate's host bytes), since a published run's host use depends on how its
framework offloads (ArcticTraining copies offloaded checkpoints to pageable memory with ``.cpu()``; dstune's runner
pins them, and pinned host memory is allocated in powers of two).

Which estimate figure a published one is compared with: ``allocated`` with the tensors' peak (the estimate's total
less the CUDA context, NCCL buffers and the allocator's reserve), ``reserved`` with the total less the context and
NCCL, ``nvidia-smi`` and ``unspecified`` with the whole total; an ``nvidia-smi`` figure read with NVML's first
``nvmlDeviceGetMemoryInfo`` (a row's ``nvml_api: v1``: ArcticTraining's ``NV``,
``pynvml.nvmlDeviceGetMemoryInfo(h).used`` in ``arctic_training/debug.py``) is ``total - free`` over the whole
card, so it also counts what the driver keeps beyond CUDA's ``total_memory``: the total plus :data:`NVML_TOTAL`
less the GPU type's usable memory. Rows whose source says the figure was measured on another stack
(``figure_stack``) are scored, and left out of the per-kind errors of like with like. The verdict: a row is pruned
when the estimate with dstune's default margin (:data:`tuner.forecast.calibration.DEFAULT_MARGIN`) does not fit
the GPU; a published run that trained must not be pruned, one that ran out of memory must not fit. Rows whose
estimate lies within that margin of the GPU's memory are "at the margin": reported, not counted as disagreements.

Run: ``.venv/bin/python bench/published_gpu.py [--only ID] [--out bench/results/published_gpu.md]`` (the tables are
rewritten; the results file's ``## Notes`` section is kept).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tuner.cli.options import WorkloadFlags, build
from tuner.errors import InputError
from tuner.estimator import MemoryEstimate, estimate
from tuner.forecast.calibration import DEFAULT_MARGIN

HERE = Path(__file__).parent
DATA = HERE / "data" / "published_gpu.yaml"
CONFIGS = HERE / "configs"
BUILTIN = {"gpt2-1.5b-megatron", "gpt2-10b-megatron"}  # Megatron-LM GPT-2: dstune's built-in GPT-2
UNITS = {"GB": 2**30, "GiB": 2**30, "MiB": 2**20, "MB": 2**20}  # GB as DeepSpeed's memory logs print it
NOTES = "## Notes\n"  # a results file's hand-written part, kept when the tables are rendered again
OUTSIDE = ("cuda_context", "allocator_reserve")  # with nccl_*: not in max_memory_allocated
# nvidia-smi's (NVML's) total of a card, where a source gives it: 81,559 MiB on an H100 80GB (modal-labs/modal-client
# PR #2797, as tuner/workload/gpu_types.py quotes it), against total_memory's 81,082 MiB
NVML_TOTAL = {"h100-80gb": 81_559 * 2**20}


@dataclass
class Scored:
    """One row's estimate beside what was published."""

    row: dict[str, Any]
    estimate: MemoryEstimate | None = None
    refused: str = ""
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return self.estimate.gpu_total if self.estimate else 0

    def compared(self) -> int | None:
        """The estimate's figure of the published figure's kind (module docstring), or None without one."""
        kind, est = self.row["measured"], self.estimate
        if est is None or kind not in ("allocated", "reserved", "nvidia-smi", "unspecified"):
            return None
        terms = est.overhead_terms
        nccl = sum(size for name, size in terms.items() if name.startswith("nccl_"))
        if kind == "allocated":
            return self.total - nccl - sum(terms.get(name, 0) for name in OUTSIDE)
        if kind == "reserved":
            return self.total - nccl - terms.get("cuda_context", 0)
        if kind == "nvidia-smi" and self.row.get("nvml_api") == "v1":
            return self.total + NVML_TOTAL[self.row["gpu_type"]] - est.gpu_memory
        return self.total

    @property
    def published_bytes(self) -> int | None:
        figure = self.row.get("figure")
        return None if figure is None else int(float(figure) * UNITS[self.row["unit"]])

    @property
    def error(self) -> float | None:
        """(estimate − published) / published, for rows with a figure."""
        mine, theirs = self.compared(), self.published_bytes
        return None if mine is None or not theirs else (mine - theirs) / theirs

    @property
    def pruned(self) -> bool:
        """The GPU side prunes it: the estimate with the default margin does not fit the GPU's memory."""
        est = self.estimate
        return est is None or est.gpu_total * (1 + DEFAULT_MARGIN) > est.gpu_memory

    @property
    def cpu_short(self) -> bool:
        """The node's CPU memory does not hold the estimate's host side."""
        return self.estimate is not None and self.estimate.cpu_headroom < 0

    @property
    def at_margin(self) -> bool:
        """The estimate within the default margin of the GPU's memory (either side): the verdict is not scored."""
        est = self.estimate
        return est is not None and abs(est.gpu_total - est.gpu_memory) <= DEFAULT_MARGIN * est.gpu_memory

    @property
    def verdict(self) -> str:
        """The GPU side's verdict against the published outcome: agree, disagree, at margin, or refused."""
        if self.estimate is None:
            return "refused"
        fits = self.estimate.headroom >= 0
        agrees = not self.pruned if self.row["outcome"] == "fits" else not fits
        if agrees:
            return "agree"
        return "at margin" if self.at_margin else "disagree"


LIGER_NOTE = "model type liger"  # ArcticTraining's Liger-Kernel model (the row's note)


def flags_of(row: dict[str, Any], ds_config: str | None, liger: bool = True) -> WorkloadFlags:
    """The ``dstune estimate`` flags of a row (module docstring for what is decided here); ``liger``: rows that train
    with Liger-Kernel estimated with ``--liger``."""
    liger = liger and LIGER_NOTE in (row.get("note") or "")
    model = row["model"]
    path = CONFIGS / model / "config.json" if (CONFIGS / model).is_dir() else CONFIGS / f"{model}.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    hidden = config.get("hidden_size") or config.get("n_embd") or 4096
    vocab = config.get("vocab_size", 128_256)
    local = row["seq_len"] // row["sequence_parallel"]
    return WorkloadFlags(
        model=str(path) if path.exists() else model,
        gpus=row["gpus"],
        nodes=row["nodes"],
        gpu_type=row["gpu_type"],
        cpu_memory=row["cpu_memory"],
        seq_len=row["seq_len"],
        micro_batch=row["micro_batch"],
        precision=row["precision"],
        stage=row["stage"],
        offload_optimizer=row["offload_optimizer"],
        offload_param=row["offload_param"],
        activation_checkpointing=row["activation_checkpointing"],
        layouts={**WorkloadFlags().layouts, "sequence_parallel": row["sequence_parallel"]},
        tiled_mlp=math.ceil(local / hidden) if row["tiled_mlp"] else 1,
        tiled_loss=max(2, math.ceil(local * vocab * 4 / 2**30)) if row["tiled_loss"] and not liger else 1,
        offload_checkpoints=row["offload_checkpoints"],
        model_impl="builtin" if model in BUILTIN else "transformers",
        ds_config=ds_config,
        optimizer=row.get("optimizer", "adamw"),
        bf16_master_weights=row.get("bf16_master_weights", False),
        bf16_optimizer_states=row.get("bf16_optimizer_states", False),
        attention=row.get("attention"),
        liger=liger,
    )


AUTOCAST_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def ds_override(row: dict[str, Any]) -> dict[str, Any]:
    """The ds_config sections a row sets beyond the flags: its ``zero`` keys, ``torch_autocast``, the allocator's
    expandable segments."""
    override: dict[str, Any] = {}
    if row.get("zero"):
        override["zero_optimization"] = {"stage": row["stage"], **row["zero"]}
    if row.get("torch_autocast"):
        override["torch_autocast"] = {"enabled": True, "dtype": AUTOCAST_DTYPES[row["torch_autocast"]]}
    if "expandable_segments:True" in row.get("alloc_conf", ""):
        override["dstune"] = {"expandable_segments": True}
    return override


def score(row: dict[str, Any], folder: Path, liger: bool = True) -> Scored:
    """The estimate of one row (``dstune estimate``'s own path: the flags built, then estimated)."""
    start = time.perf_counter()
    ds_config = None
    override = ds_override(row)
    if override:
        path = folder / f"{row['id']}.json"
        path.write_text(json.dumps(override))
        ds_config = str(path)
    try:
        workload, trial = build(flags_of(row, ds_config, liger))
        found = Scored(row, estimate(workload, trial))
    except (InputError, SystemExit) as error:  # build() exits 2 with one line on bad input
        found = Scored(row, refused=str(error) or "refused")
    found.seconds = time.perf_counter() - start
    return found


def gib(size: int | None) -> str:
    return "-" if size is None else f"{size / 2**30:.2f}"


def error_line(kind: str, scored: list[Scored]) -> str:
    """One row of the per-kind error table: the rows of ``kind`` with a figure."""
    errors = [s.error for s in scored if s.row["measured"] == kind and s.error is not None]
    if not errors:
        return f"| {kind} | 0 | - | - | - |"
    worst = max(errors, key=abs)
    return (
        f"| {kind} | {len(errors)} | {statistics.median(errors):+.1%} | "
        f"{statistics.median(abs(e) for e in errors):.1%} | {worst:+.1%} |"
    )


def render(scored: list[Scored]) -> str:
    """The Markdown report: per-kind errors, the verdicts, and every row."""
    lines = [
        "# `dstune estimate` against published GPU runs",
        "",
        f"`bench/published_gpu.py` on {len(scored)} rows of `bench/data/published_gpu.yaml` (sources and quotes "
        "there). Estimates in GiB per GPU; the published figure in its own unit; the error is the estimate's "
        "figure of the same kind against it (module docstring). Verdict: the estimate with dstune's default "
        f"{DEFAULT_MARGIN:.0%} margin against the published outcome.",
        "",
        "## Error per kind of published figure",
        "",
        "| kind | rows | median error | median abs error | worst |",
        "|---|---|---|---|---|",
    ]
    for kind in ("allocated", "reserved", "nvidia-smi", "unspecified"):
        lines.append(error_line(kind, [s for s in scored if not s.row.get("figure_stack")]))
    apart = [s for s in scored if s.row.get("figure_stack") and s.error is not None]
    if apart:
        lines += [
            "",
            "Figures measured on another stack than the config's (`figure_stack`; not in the table above):",
            "",
        ]
        lines += [f"- {s.row['id']}: {s.error:+.1%} ({s.row['figure_stack']})" for s in apart]
    verdicts = [s.verdict for s in scored]
    lines += [
        "",
        "## Verdicts",
        "",
        ", ".join(f"{name}: {verdicts.count(name)}" for name in ("agree", "disagree", "at margin", "refused")),
        "",
        "| row | GPU | outcome | estimate GiB | of GiB | published | error | pruned | cpu short | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in scored:
        row, est = s.row, s.estimate
        figure = "-" if row["figure"] is None else f"{row['figure']} {row['unit']} ({row['measured']})"
        error = "-" if s.error is None else f"{s.error:+.1%}"
        gpus = f"{row['nodes']}×{row['gpus']} {row['gpu_type']}"
        memory = gib(est.gpu_memory) if est else "-"
        verdict = s.verdict if not s.refused else f"refused: {s.refused}"
        lines.append(
            f"| [{row['id']}]({row['url']}) | {gpus} | {row['outcome']} | {gib(s.total) if est else '-'} | {memory} "
            f"| {figure} | {error} | {'yes' if s.pruned else 'no'} | {'yes' if s.cpu_short else 'no'} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="rows whose id contains this")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "published_gpu.md")
    parser.add_argument("--no-liger", action="store_true", help="Liger rows as before --liger (module docstring)")
    args = parser.parse_args()
    rows = [row for row in yaml.safe_load(DATA.read_text()) if args.only in row["id"]]
    scored = []
    with tempfile.TemporaryDirectory() as folder:
        for row in rows:
            found = score(row, Path(folder), not args.no_liger)
            scored.append(found)
            print(f"{row['id']}: {found.verdict} {gib(found.total)} GiB ({found.seconds:.1f} s)", file=sys.stderr)
    notes = args.out.read_text().partition(NOTES)[2] if args.out.exists() else ""
    args.out.write_text(render(scored) + (f"\n{NOTES}{notes}" if notes else ""))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
