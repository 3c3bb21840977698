"""The numerics guard's tolerances, measured: how far step-0 loss and global gradient norm move between configs that
are equal in exact arithmetic.

Runs the tiny built-in GPT-2 (``tiny-gpt2``, seq 64) on 2 gloo CPU ranks with real DeepSpeed (the runner as a study
runs it, :func:`tuner.measure.run.run_measurement`), global batch 8, in fp32 and bf16, over ZeRO stages 0-3 × micro
× accumulation splits (4×1, 2×2, 1×4), and one run with the fault switch (``dstune.fault_loss_scale: 0.5``). Writes
``bench/results/numerics_noise.md``: per precision the figures, and the largest relative difference from the
precision's ZeRO-0 micro-4 run (the reference a study would take).

Run: ``PYTHONPATH=. DS_ACCELERATOR=cpu .venv/bin/python bench/numerics_noise.py [--world 2] [--splits 4x1,2x2,1x4]``
(about 25 runs, 5-20 s each on two shared cores). ``--model tiny-llama --peft adapter_config.json`` measures the
README's LoRA example instead (the transformers model, torch's AdamW: the study's own optimizer is DeepSpeed's) and
writes ``numerics_noise_<model>[_lora].md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

OUT = Path(__file__).with_name("results") / "numerics_noise.md"


def config(precision: str, stage: int, micro: int, accum: int, world: int, **dstune: float) -> TrialConfig:
    """A ds_config for the tiny model: small buckets, torch's AdamW, DeepSpeed's default clipping left out."""
    ds: dict = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * world,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 50_000, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    if dstune:
        ds["dstune"] = dict(dstune)
    return TrialConfig(ds)


def run(workload: Workload, trial: TrialConfig) -> dict:
    """The run's numerics (or its error)."""
    measured = run_measurement(workload, trial, MeasureOptions(warmup=1, steps=2, timeout=600, launcher="local"))
    if measured.status != "ok":
        return {"status": measured.status, "error": (measured.error or "")[-300:]}
    return {"status": "ok", **measured.numerics}


def bench_workload(model: str, peft: str | None, world: int) -> tuple[Workload, Path]:
    """The tiny built-in GPT (the guard's first measurement), or a preset's transformers model with an optional
    LoRA adapter, on ``world`` CPU ranks at 64 tokens; and where its results go."""
    if model == "tiny-gpt2" and not peft:
        cluster = ClusterSpec(gpus_per_node=world, device="cpu")
        return Workload(load_builtin_model(model), cluster, TrainSpec(seq_len=64)), OUT
    from tuner.requests import WorkloadRequest, to_workload

    adapter = json.loads(Path(peft).read_text()) if peft else None
    request = WorkloadRequest(model=model, gpus=world, device="cpu", seq_len=64, gpu_memory="1GiB", peft=adapter)
    return to_workload(request), OUT.with_name(f"numerics_noise_{model}{'_lora' if peft else ''}.md")


def rel(a: float | None, b: float | None) -> float | None:
    """|a − b| / |b|."""
    return None if a is None or b is None else abs(a - b) / abs(b)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--splits", default="4x1,2x2,1x4")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--stages", default="0,1,2,3")
    parser.add_argument("--no-fault", action="store_true", help="leave out the run with the fault switch")
    parser.add_argument("--model", default="tiny-gpt2", help="a preset; other than tiny-gpt2: the transformers model")
    parser.add_argument("--peft", help="a peft adapter_config.json (LoRA)")
    args = parser.parse_args()
    workload, out = bench_workload(args.model, args.peft, args.world)
    splits = [tuple(int(x) for x in s.split("x")) for s in args.splits.split(",")]
    lines = [
        "# Numerics guard: step-0 noise between equivalent configs",
        "",
        f"{args.model}{' with the LoRA adapter ' + Path(args.peft).name if args.peft else ''}, seq 64, "
        f"{args.world} gloo CPU ranks, DeepSpeed as installed, global batch "
        f"{splits[0][0] * splits[0][1] * args.world}; measured by `bench/numerics_noise.py` (real runs, the runner's "
        "`first_step_numerics`). Relative differences are against the first row of each precision.",
        "",
        "| precision | ZeRO | micro × accum | step-0 loss | step-0 grad norm | Δloss rel | Δnorm rel |",
        "|---|---|---|---|---|---|---|",
    ]
    results = {}
    for precision in args.precisions.split(","):
        reference = None
        worst = [0.0, 0.0]
        rows: list[tuple[int, int, int, dict[str, float]]] = [
            (stage, m, a, {}) for stage in map(int, args.stages.split(",")) for m, a in splits
        ]
        if not args.no_fault:
            rows.append((2, splits[0][0], splits[0][1], {"fault_loss_scale": 0.5}))
        for stage, micro, accum, fault in rows:
            found = run(workload, config(precision, stage, micro, accum, args.world, **fault))
            label = f"{precision} z{stage} {micro}x{accum}" + (" fault" if fault else "")
            results[label] = found
            print(label, json.dumps(found)[:300], flush=True)
            if found["status"] != "ok":
                lines.append(f"| {precision} | {stage} | {micro} × {accum} | {found['status']} | | | |")
                continue
            reference = reference or found
            d_loss = rel(found["step0_loss"], reference["step0_loss"])
            d_norm = rel(found["step0_grad_norm"], reference["step0_grad_norm"])
            if not fault:
                worst = [max(worst[0], d_loss or 0.0), max(worst[1], d_norm or 0.0)]
            name = f"{stage}" + (" (fault 0.5)" if fault else "")
            lines.append(
                f"| {precision} | {name} | {micro} × {accum} | {found['step0_loss']:.7f} | "
                f"{found['step0_grad_norm']:.7f} | {d_loss:.2e} | {d_norm:.2e} |"
            )
        lines.append(f"| {precision} | **largest** (faults excluded) | | | | **{worst[0]:.2e}** | **{worst[1]:.2e}** |")
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
