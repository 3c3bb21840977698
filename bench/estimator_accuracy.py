"""Estimated against measured memory over a matrix of configs, written as a Markdown table.

CPU (here): every config runs on real DeepSpeed CPU ranks; bytes are counted by category from live tensor storages
at each phase of a step (``tuner.measure.rank.memory_probe``) and compared with the estimate's same phase, on the worst
rank. CUDA (a GPU machine): the peak estimate (overhead excluded) is compared with ``torch.cuda.max_memory_allocated``.

``--suite transformers`` measures real transformers models (random weights, every preset architecture at small
dimensions, ``tests/tiny_configs.py``): parameter counts against the built model; activations (the estimate's
forward phase, from the traced profile) against the bytes the real model saves on CPU tensors, bf16 and fp32, two
sequence lengths, checkpointing on and off; and the peak against real DeepSpeed runs (1 CPU rank: bf16 ZeRO-0, and
fp32 ZeRO-2 with checkpointing).

Run: ``.venv/bin/python bench/estimator_accuracy.py --device cpu --out bench/results/estimator_accuracy_cpu.md``
or ``.venv/bin/python bench/estimator_accuracy.py --suite transformers --out
bench/results/estimator_accuracy_transformers.md``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from tuner.estimator import estimate
from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.space.dsconfig import merge_configs, shortcut_config
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

# the tiny configs and what a model really saves are test helpers (tests/tiny_configs.py, tests/real_saved_bytes.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

STATES = ("parameters", "gradients", "optimizer_states")


def matrix(device: str) -> list[tuple[str, int, str, int, int, str, bool]]:
    """(model, world, precision, stage, micro-batch, offload, checkpointing) cases."""
    if device == "cuda":  # one GPU: world size 1, models big enough for the allocator's view to matter
        return [
            (model, 1, "bf16", stage, micro, "none", ckpt)
            for model in ("gpt2", "qwen2-1.5b")
            for stage in (0, 1, 2, 3)
            for micro, ckpt in ((4, False), (8, True))
        ] + [("qwen2-1.5b", 1, "bf16", 2, 4, "optimizer", False), ("gpt2", 1, "fp32", 2, 4, "none", False)]
    cases = [
        (model, world, precision, stage, 2, "none", False)
        for model in ("tiny-gpt2", "tiny-llama")
        for world in (1, 2)
        for precision in ("bf16", "fp32")
        for stage in (0, 1, 2, 3)
    ]
    cases += [
        ("tiny-llama", 2, "bf16", 2, 4, "optimizer", False),
        ("tiny-llama", 2, "bf16", 3, 4, "optimizer", False),
        ("tiny-gpt2", 2, "bf16", 3, 8, "none", True),
        ("tiny-llama", 1, "bf16", 2, 8, "none", True),
    ]
    return cases


def ds_config(precision: str, stage: int, micro: int, offload: str, device: str) -> dict:
    """``dstune estimate``'s shortcut config; on CPU with buckets sized for the tiny models, and torch's AdamW where
    the optimizer is not offloaded (no fused op to compile; the same bytes)."""
    config = shortcut_config(micro, 1, precision, stage, "cpu" if offload == "optimizer" else "none", "none")
    if device != "cpu":
        return config
    small = {"reduce_bucket_size": 50_000, "allgather_bucket_size": 50_000, "stage3_prefetch_bucket_size": 50_000}
    torch_adam = {} if offload == "optimizer" else {"optimizer": {"params": {"torch_adam": True}}}
    return merge_configs(config, {"zero_optimization": small, **torch_adam})


def relative(estimated: float, measured: float) -> float:
    return estimated / measured - 1 if measured else 0.0


def run_case(case: tuple, device: str, seq_len: int, workload: Workload | None = None) -> tuple[str, float | None]:
    model, world, precision, stage, micro, offload, ckpt = case
    workload = workload or Workload(
        load_builtin_model(model),
        ClusterSpec(gpus_per_node=world, device=device, gpu_memory=140 * 2**30),
        TrainSpec(seq_len=seq_len, precision=precision),
    )
    config = TrialConfig(ds_config(precision, stage, micro, offload, device), ckpt)
    est = estimate(workload, config)
    run = run_measurement(
        workload, config, MeasureOptions("local", warmup=2, steps=1 if device == "cpu" else 3, timeout=900)
    )
    flags = (" off" if offload != "none" else "") + (" ckpt" if ckpt else "")
    name = f"{model} N={world} {precision} z{stage} mb{micro}{flags}"
    if run.status != "ok":
        return f"| {name} | {run.status} | | | | | |", None
    if device == "cuda":
        predicted = est.per_gpu["total"] - est.per_gpu["overhead"]
        measured = max(rank.peak_allocated for rank in run.ranks)
        error = relative(predicted, measured)
        return (
            f"| {name} | {est.peak_phase} | {predicted / 2**20:,.1f} | {measured / 2**20:,.1f} | {error:+.2%} |",
            error,
        )
    phase = est.peak_phase
    held = est.phases[phase].by_category()
    worst = {k: max(r.snapshots[phase][k] for r in run.ranks) for k in (*STATES, "buffers")}
    transients = est.details.get("logits_workspace", 0) + est.details.get("stage3_working_set", 0)
    est_buffers = held["buffers"] - (transients if phase == "forward" else 0)
    est_act = held["activations"]
    meas_act = max(r.activation_bytes for r in run.ranks) if phase == "forward" else 0
    states_err = relative(sum(held[k] for k in STATES), sum(worst[k] for k in STATES))
    total_est = sum(held[k] for k in STATES) + est_buffers + est_act
    total_meas = sum(worst.values()) + meas_act
    error = relative(total_est, total_meas)
    return (
        f"| {name} | {phase} | {states_err:+.2%} | {relative(est_buffers, worst['buffers']):+.2%} | "
        f"{relative(est_act, meas_act):+.2%} | {total_est / 2**20:,.2f} | {total_meas / 2**20:,.2f} | {error:+.2%} |",
        error,
    )


def transformers_workload(architecture: str, precision: str, seq_len: int) -> Workload:
    """A tiny transformers model of ``architecture`` as a CPU workload carrying its traced profile."""
    from tiny_configs import TINY_CONFIGS

    from tuner.profile import model_from_config, with_profile

    workload = Workload(
        model_from_config(TINY_CONFIGS[architecture], name=f"tiny-{architecture}"),
        ClusterSpec(gpus_per_node=1, device="cpu", gpu_memory=140 * 2**30),
        TrainSpec(seq_len=seq_len, precision=precision),
    )
    return with_profile(workload)


CKPT_NOTE = (
    "Rows with checkpointing peak in backward, where the estimate holds one recomputed layer (its activations "
    "without checkpointing, alive while that layer's backward runs); the end-of-backward snapshot cannot see "
    "that transient, so those rows read high by exactly the recomputed layer: model states, buffers and forward "
    "activations match to 0.1 %."
)


def transformers_suite(seq_lens: tuple[int, ...], micro: int = 2) -> str:
    """The real-transformers tables: parameters and activations (no DeepSpeed), then peaks (real DeepSpeed)."""
    from real_saved_bytes import measured_saved_bytes
    from tiny_configs import TINY_CONFIGS

    from tuner.profile.hf import build

    started = time.monotonic()
    rows, act_errors, params_exact = [], [], 0
    for architecture, config in TINY_CONFIGS.items():
        real_params = sum(p.numel() for p in build(config).parameters())
        for precision in ("bf16", "fp32"):
            for seq_len in seq_lens:
                for ckpt in (False, True):
                    workload = transformers_workload(architecture, precision, seq_len)
                    config_ = TrialConfig(
                        {
                            "train_micro_batch_size_per_gpu": micro,
                            **({"bf16": {"enabled": True}} if precision == "bf16" else {}),
                        },
                        ckpt,
                    )
                    est = estimate(workload, config_)
                    params_exact += est.n_params == real_params
                    predicted = est.phases["forward"].gpu["activations"]
                    real = measured_saved_bytes(config, micro, seq_len, precision, "sdpa", ckpt)
                    error = relative(predicted, real)
                    act_errors.append(error)
                    rows.append(
                        f"| {architecture} | {precision} | {seq_len} | {'on' if ckpt else 'off'} | "
                        f"{est.n_params:,} | {real_params:,} | {predicted:,} | {real:,} | {error:+.3%} |"
                    )
                    print(rows[-1], flush=True)
    header = (
        "| architecture | precision | seq | ckpt | params (est.) | params (model) | activations est. B | "
        "saved by the real model B | error |\n|---|---|---|---|---|---|---|---|---|"
    )
    text = (
        f"## Parameters and activations (micro-batch {micro}, SDPA, 4-layer models, real CPU tensors)\n\n{header}\n"
        + "\n".join(rows)
        + f"\n\n{params_exact}/{len(rows)} parameter counts exact; activations |error| worst "
        f"{max(abs(e) for e in act_errors):.4%}, median {statistics.median(abs(e) for e in act_errors):.4%} "
        f"({time.monotonic() - started:.0f} s).\n"
    )
    peak_rows, peak_errors = [], []
    started = time.monotonic()
    for architecture in TINY_CONFIGS:
        for precision, stage, ckpt in (("bf16", 0, False), ("fp32", 2, True)):
            case = (f"tiny-{architecture}", 1, precision, stage, micro, "none", ckpt)
            workload = transformers_workload(architecture, precision, seq_lens[0])
            row, error = run_case(case, "cpu", seq_lens[0], workload)
            peak_rows.append(row)
            print(row, flush=True)
            if error is not None:
                peak_errors.append(error)
    peak_header = (
        "| config | peak phase | model states | buffers | activations | est. MiB | measured MiB | error |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    text += (
        f"\n## Peak against real DeepSpeed 0.19 (1 CPU rank, seq {seq_lens[0]}, micro-batch {micro})\n\n"
        f"{peak_header}\n" + "\n".join(peak_rows) + f"\n\n{len(peak_errors)} runs in "
        f"{time.monotonic() - started:.0f} s; worst under-estimate of the peak "
        f"{min(min(peak_errors), 0):+.2%}, worst |error| {max(abs(e) for e in peak_errors):.2%}.\n"
        f"{CKPT_NOTE}\n"
    )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--suite", choices=("builtin", "transformers"), default="builtin")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.suite == "transformers":
        text = "# Estimated vs real transformers models (cpu)\n\n" + transformers_suite((64, 128))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        return
    seq_len = args.seq_len or (64 if args.device == "cpu" else 1024)
    if args.device == "cuda":
        header = "| config | peak phase | estimated MiB | max_memory_allocated MiB | error |\n|---|---|---|---|---|"
    else:
        header = (
            "| config | peak phase | model states | buffers | activations | est. MiB | measured MiB | error |\n"
            "|---|---|---|---|---|---|---|---|"
        )
    rows, errors = [], []
    started = time.monotonic()
    for case in matrix(args.device):
        row, error = run_case(case, args.device, seq_len)
        rows.append(row)
        print(row, flush=True)
        if error is not None:
            errors.append(abs(error))
    summary = (
        f"\n{len(errors)} configs measured on {args.device} (seq {seq_len}) in {time.monotonic() - started:.0f} s; "
        f"|error| of the peak: median {statistics.median(errors):.2%}, worst {max(errors):.2%}\n"
    )
    text = f"# Estimated vs measured memory ({args.device})\n\n{header}\n" + "\n".join(rows) + "\n" + summary
    print(summary)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
