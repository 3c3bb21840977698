"""LoRA under DeepSpeed: the estimate against the true peak of live tensor bytes and against the model states
DeepSpeed holds, per ZeRO stage, on 2 CPU ranks (gloo, bf16).

Truth: the allocator's own count (:class:`tuner.measure.rank.true_peak.CpuAllocatorPeak`: live tensor bytes counted at
torch's CPU allocator on every thread, started before the model is built, over two steps) for the peak; the
engine's and optimizer's live storages after the second step
(:func:`tuner.measure.rank.memory_probe.classify_engine_memory`: parameters + optimizer states + gradients) for the
model states. The model is built as a measured run builds it (:func:`tuner.measure.rank.birth.born_on_device`: under
``zero.Init`` for ZeRO-3), then the adapter is added with the real peft library (:func:`apply_trainable`, outside
``zero.Init``, as the HF Trainer adds it to a loaded model) and only the trainable parameters go to the optimizer (as
the HF Trainer's optimizer takes them). A tiny LLaMA-style model and a tiny Mixtral-shaped MoE, LoRA r=8 on q_proj and
v_proj (and, in the ``modules_to_save`` rows, the LM head trained whole), seq 64, micro-batch 2, DeepSpeed's default or
small buckets and the Adam it picks on CPU.

This bench has its own small launcher (one process per rank): measured runs (:mod:`tuner.measure.rank.runner`) learn
peft separately. ``tests/estimator/test_peft_deepspeed.py`` runs the same rank function as the slow-tier check.

Run: ``python bench/peft_memory.py`` (about 2 minutes on 2 cores) writes ``bench/results/peft_memory.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 344,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
TINY_MIXTRAL = {
    "model_type": "mixtral",
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
MODELS = {"tiny-llama": TINY_LLAMA, "tiny-mixtral": TINY_MIXTRAL}
LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
SEQ, MICRO, WORLD, STEPS = 64, 2, 2, 2
SMALL_BUCKET = 20_000  # elements: buckets smaller than the model, so activations and states set the peak
SMALL_BUCKETS = {
    "zero_optimization": {
        "reduce_bucket_size": SMALL_BUCKET,
        "allgather_bucket_size": SMALL_BUCKET,
        "stage3_prefetch_bucket_size": SMALL_BUCKET,
    }
}
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},  # DeepSpeed's 5e8-element buckets: on a tiny model they are the peak
    "small_buckets": SMALL_BUCKETS,
    "modules_to_save": SMALL_BUCKETS,  # the LM head trained whole beside the adapters (#7669), tiny LLaMA only
}
ADAPTERS = {"modules_to_save": {**LORA, "modules_to_save": ["lm_head"]}}


def adapter(variant: str) -> dict[str, Any]:
    """The variant's adapter config (LoRA on q_proj and v_proj unless it says otherwise)."""
    return ADAPTERS.get(variant, LORA)


def workload(name: str, adapter: dict[str, Any] | None = None, freeze: str = "") -> Any:
    """The bench's workload (with its model-as-trained profile)."""
    from tuner.profile import model_from_config, with_profile
    from tuner.workload import ClusterSpec, TrainableSpec, TrainSpec, Workload

    cluster = ClusterSpec(gpus_per_node=WORLD, device="cpu", gpu_memory=140 * 2**30)
    train = TrainSpec(seq_len=SEQ, precision="bf16")
    trainable = TrainableSpec.of(adapter if adapter is not None else LORA, freeze)
    base = Workload(model_from_config(MODELS[name], name=name), cluster, train, trainable=trainable)
    return with_profile(base, checkpointing=(False,))


def ds_config(stage: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``dstune estimate``'s shortcut config in bf16 at ``stage``."""
    from tuner.space.dsconfig import merge_configs, shortcut_config

    return merge_configs(shortcut_config(MICRO, 1, "bf16", stage, "none", "none"), extra or {})


def rank_main(rank: int, port: int, spec: dict[str, Any], out: str) -> None:
    """One rank: build, add the adapter, initialise DeepSpeed over the trainable parameters, run ``STEPS`` steps
    under the true-peak instrument; write the peak and the engine's held bytes to ``out``/rank<r>.json."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD)
    )
    from tuner.measure.op_builds import use_environment_ninja

    use_environment_ninja()  # DeepSpeed checks its ops with the ninja the product's runs use, or rebuilds them
    import deepspeed
    import torch

    from tuner.measure.rank.birth import born_on_device, initialise_partitioned
    from tuner.measure.rank.memory_probe import classify_engine_memory
    from tuner.measure.rank.models import build_transformers_model, synthetic_batch
    from tuner.measure.rank.true_peak import CpuAllocatorPeak
    from tuner.profile.trainable import apply_trainable
    from tuner.workload import TrainableSpec, workload_from_dict

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    work = workload_from_dict(spec["workload"])
    config = spec["ds_config"]
    torch.manual_seed(0)
    tracker = CpuAllocatorPeak(detail=spec.get("detail", False))
    tracker.start()
    with born_on_device(config, "cpu", transformers=True):
        wrapper = build_transformers_model(json.loads(work.model.hf_config), work.train.attention)
    initialise_partitioned(wrapper)  # as measured runs do: ZeRO-3's MoE experts are torch.empty until then
    wrapper.model = apply_trainable(wrapper.model, TrainableSpec(**spec["trainable"]))
    trainable = [p for p in wrapper.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=wrapper, model_parameters=trainable, config=config)
    tokens, targets = synthetic_batch(work.model, MICRO, SEQ, "cpu", seed=rank)
    for step in range(STEPS):
        tracker.mark(f"step {step} forward")
        loss = engine(tokens, targets)
        tracker.mark(f"step {step} backward")
        engine.backward(loss)
        tracker.mark(f"step {step} step")
        engine.step()
    report = tracker.stop()
    held = classify_engine_memory(engine)
    params = list(engine.module.parameters())
    dtypes: dict[str, int] = {}
    for p in params:
        tensor = p.ds_tensor if hasattr(p, "ds_tensor") else p.data
        key = f"{'trainable' if p.requires_grad else 'frozen'}_{str(tensor.dtype).removeprefix('torch.')}"
        dtypes[key] = dtypes.get(key, 0) + tensor.numel()
    result = {
        "rank": rank,
        "true_peak_bytes": report["peak_bytes"],
        "peak_during": report["peak_during"],
        "held": held,
        "param_elements": dtypes,
        "trainable_numel": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in trainable),
        "loss": float(loss),
        "live_at_peak": report.get("live_at_peak"),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(
    work: Any, config: dict[str, Any], timeout: float = 600, detail: bool | str = False
) -> list[dict[str, Any]]:
    """Both ranks' reports for one run (spawned processes; a failed rank raises with its exit code)."""
    import torch.multiprocessing as mp

    from tuner.workload import workload_to_dict

    spec = {
        "workload": workload_to_dict(work),
        "trainable": workload_to_dict(work).get("trainable", {}),
        "ds_config": config,
        "detail": detail,
    }
    with tempfile.TemporaryDirectory() as out:
        context = mp.start_processes(
            rank_main, args=(_free_port(), spec, out), nprocs=WORLD, join=False, start_method="spawn"
        )
        while not context.join(timeout=timeout):
            pass
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]


def model_states(held: dict[str, int]) -> int:
    """What an engine holds for the model between steps: parameters, gradients, optimizer states."""
    return held["parameters"] + held["gradients"] + held["optimizer_states"]


def estimated_states(est: Any) -> int:
    """The estimate's model states between steps: parameters as backward holds them (ZeRO-3's persistent copies
    too), optimizer states, and the gradients every phase holds (ZeRO-3's partition)."""
    phases = est.phases
    return (
        phases["backward"].gpu["parameters"]
        + phases["step"].gpu["optimizer_states"]
        + phases["forward"].gpu["gradients"]
    )


def case_key(name: str, stage: int, variant: str) -> str:
    return f"{name}/z{stage}/{variant}"


def cases() -> list[tuple[str, int, str]]:
    return [
        (name, stage, variant)
        for variant in VARIANTS
        for name in MODELS
        for stage in (0, 1, 2, 3)
        if variant not in ADAPTERS or (name == "tiny-llama" and stage < 3)  # ZeRO-3 refuses mixed dtypes
    ]


def run_all(measured: dict[str, Any], only: str, remeasure: bool, path: Path) -> None:
    for name, stage, variant in cases():
        key = case_key(name, stage, variant)
        if only not in key or (key in measured and not remeasure):
            continue
        ranks = measure(workload(name, adapter(variant)), ds_config(stage, VARIANTS[variant]))
        measured[key] = {"ranks": ranks}
        path.write_text(json.dumps(measured, indent=1))
        print(key, [r["true_peak_bytes"] for r in ranks], [model_states(r["held"]) for r in ranks], flush=True)


def scored(key: str, data: dict[str, Any]) -> dict[str, Any]:
    """One case: the estimate against the measured ranks (the worst rank's peak and states)."""
    from tuner.estimator import estimate

    name, stage_text, variant = key.split("/")
    stage = int(stage_text[1:])
    est = estimate(workload(name, adapter(variant)), ds_config(stage, VARIANTS[variant]))
    ranks = data["ranks"]
    worst = max(ranks, key=lambda r: r["true_peak_bytes"])
    return {
        "name": name,
        "stage": stage,
        "variant": variant,
        "trainable_est": est.trainable_params,
        "trainable_real": ranks[0]["trainable_numel"],
        "states_est": estimated_states(est),
        "states_real": max(model_states(r["held"]) for r in ranks),
        "peak_est": est.per_gpu["total"] or 0,
        "peak_real": worst["true_peak_bytes"],
        "phase": est.peak_phase,
        "during": worst["peak_during"],
    }


FINDINGS = """
## What DeepSpeed 0.19.8 does with frozen parameters (measured here, read in its code)

* The optimizer gets the trainable parameters only (as the HF Trainer's does): gradients, fp32 masters and Adam
  states exist for them alone, at every stage (``12·T`` bytes of optimizer state for ``T`` trainable elements,
  divided by the ranks at ZeRO 1-3). The held model states above match to the byte.
* ZeRO-0: the engine casts every parameter to the training dtype (``_cast_module_mixed_precision``), so peft's fp32
  adapters train in bf16.
* ZeRO-1/2: frozen weights stay outside the flat fp32 and 16-bit groups, whole on every rank, in the training dtype
  (replicated: ``e·(Ψ-T)`` per rank); the flat groups, partitions and gradients cover the trainable elements only.
* ZeRO-3: frozen weights are partitioned like the rest (the base was built under ``zero.Init``; the engine converts
  the adapters peft added afterwards with ``_convert_to_zero_parameters``). Parameters of at most
  ``stage3_param_persistence_threshold`` (1e5) elements stay whole on every rank whether they train or not: all
  LoRA adapters, and every frozen norm and small projection. A ``zero.Init`` model is not cast, so peft's adapters
  stay fp32 (shards and persistent copies at 4 bytes; their activations, the LoRA A input and the dropout output,
  in fp32 too); the gradient partition and reduce bucket are in the training dtype, over the trainable shards.
* Reduce buckets do not shrink with the trainable count: ZeRO 1-3 allocate ``reduce_bucket_size`` elements
  (``5e8`` by default: 954 MiB in bf16) however few parameters train, which is the whole peak of a small LoRA run
  with default buckets. ``stage3_param_persistence_threshold`` keeps the adapters whole, so ZeRO-3 gathers only
  frozen weights.
* ``modules_to_save`` copies are ordinary trainable parameters beside their frozen original (the module's bytes
  twice, the copy with gradients and optimizer states): measured at ZeRO 0-2 in the ``modules_to_save`` rows
  (the LM head). ZeRO-3 cannot train them beside peft's fp32 adapters in 16-bit training: its optimizer flattens
  the trainable parameters into one buffer and ``defragment`` asserts a single dtype (the ranks fail in
  ``deepspeed.initialize``, ``tests/estimator/test_peft_deepspeed.py``), so the estimator refuses that config
  naming ``zero_optimization.stage``, and a study prunes it with the reason.
* With few trainable parameters backward's worst moment comes before any weight gradient: the loss's backward
  (one more logits-sized tensor beside the saved activations and the logits workspace), and at ZeRO 1-3 the
  moment the first adapter gradient allocates the bucket, with the other layers' activations still saved.

ZeRO-3 with small buckets, and how it was closed (it was 4-8 % under on tiny LLaMA and 22-35 % on tiny Mixtral):

* **The instrument over-counted.** ``torch.profiler`` records allocations and frees on the threads it profiles
  only; gloo frees ZeRO-3's all-gather buffers on its own worker threads, so they stayed alive in its sum (2.1-2.4
  MiB of a 12 MiB peak, found as live addresses the allocator handed out again), differently on each rank and run.
  The true peak is now counted at torch's CPU allocator on every thread (:mod:`tuner.measure.rank.counting_allocator`):
  both ranks' peaks agree to the byte, run after run.
* **transformers 5 fuses an MoE's experts into one module** that runs every step, so DeepSpeed's trace of module
  order is complete from the second step and forward keeps every gathered parameter it will reuse (DeepSpeed's own
  parameter states at the loss's backward: 1,703,936 elements ``AVAILABLE``, every expert stack and the LM head).
  The estimate had assumed routed experts drop the trace; that now holds only for experts that are modules of their
  own (``ModelProfile.expert_modules``).
* **Backward never runs a LoRA model's frozen embedding**, so ZeRO-3 releases it after forward
  (:func:`tuner.estimator.states.trainable.frozen_lead`; a tied embedding is the LM head too, and stays).
* **ZeRO-3 saves every Linear's input.** ``zero.Init`` replaces ``torch.nn.functional.linear`` with
  ``LinearFunctionForZeroStage3`` (``memory_efficient_linear``, on by default, left in place for the whole run),
  whose ``save_for_backward(input, weight, bias)`` keeps the input of frozen projections that plain torch does not
  save (a LoRA base's q, k, v, o, gate, up, down and LM head): the model as trained is traced that way for ZeRO-3
  (``adapters="zero3"``, :func:`tuner.profile.autograd_saved.zero3_linear`). One of the reasons LoRA under ZeRO-3
  saves less than the ZeRO paper suggests (#5109).

MoE routing still moves the peak a little between steps (ZeRO-0: 8.72 and 8.75 MiB in two identical runs).
"""


def render(measured: dict[str, Any]) -> str:
    """The Markdown tables: per case the trainable count, model states and peak, estimated against measured; then
    ZeRO-2 against ZeRO-3 (DeepSpeed #5109's shape)."""
    rows, side = [], {}
    errors: list[float] = []
    for key in [case_key(*case) for case in cases()]:
        if key not in measured:
            continue
        if any(rank["loss"] != rank["loss"] for rank in measured[key]["ranks"]):  # NaN: DeepSpeed skipped steps
            name, stage_text, variant = key.split("/")
            rows.append(f"| {name} | {variant} | {stage_text[1:]} | loss NaN: steps skipped, not scored | |||||||||||")
            continue
        r = scored(key, measured[key])
        states_error, peak_error = r["states_est"] / r["states_real"] - 1, r["peak_est"] / r["peak_real"] - 1
        errors.append(abs(peak_error))
        side[(r["name"], r["variant"], r["stage"])] = r
        rows.append(
            f"| {r['name']} | {r['variant']} | {r['stage']} | {r['trainable_est']:,} | {r['trainable_real']:,} | "
            f"{r['states_est'] / 2**20:.3f} | {r['states_real'] / 2**20:.3f} | {states_error:+.2%} | "
            f"{r['peak_est'] / 2**20:.2f} | {r['peak_real'] / 2**20:.2f} | {peak_error:+.2%} | {r['phase']} | "
            f"{r['during']} |"
        )
    header = (
        "| model | buckets | ZeRO | trainable (est.) | trainable (DeepSpeed) | model states est. MiB | held MiB | "
        "error | "
        "peak est. MiB | true peak MiB | error | est. peak phase | true peak during |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    pairs = []
    for name in MODELS:
        for variant in VARIANTS:
            two, three = side.get((name, variant, 2)), side.get((name, variant, 3))
            if two and three:
                pairs.append(
                    f"| {name} | {variant} | {two['peak_est'] / 2**20:.2f} | {two['peak_real'] / 2**20:.2f} | "
                    f"{three['peak_est'] / 2**20:.2f} | {three['peak_real'] / 2**20:.2f} | "
                    f"{three['peak_real'] / two['peak_real']:.2f} |"
                )
    pair_header = (
        "| model | buckets | ZeRO-2 est. MiB | ZeRO-2 true MiB | ZeRO-3 est. MiB | ZeRO-3 true MiB | "
        "ZeRO-3 / ZeRO-2 (true) |\n|---|---|---|---|---|---|---|"
    )
    worst = max(errors, default=0.0)
    return (
        "# LoRA under DeepSpeed: estimate against measured (2 CPU ranks, bf16)\n\n"
        f"{__doc__.split(chr(10) + chr(10))[1]}\n\n"
        "Model states: parameters + gradients + optimizer states the engine holds between steps (live storages, "
        "worst rank). True peak: the worst rank's peak of live tensor bytes (allocator records). Produced by "
        "``bench/peft_memory.py`` from ``bench/results/peft_memory.json``.\n\n"
        + header
        + "\n"
        + "\n".join(rows)
        + f"\n\n{len(errors)} runs scored; worst |peak error| {worst:.2%}.\n\n"
        "ZeRO-2 against ZeRO-3 with LoRA (DeepSpeed #5109's shape, at small scale):\n\n"
        + pair_header
        + "\n"
        + "\n".join(pairs)
        + "\n"
        + FINDINGS
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=RESULTS / "peft_memory.json")
    parser.add_argument("--only", default="")
    parser.add_argument("--remeasure", action="store_true")
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "peft_memory.md")
    args = parser.parse_args()
    measured = json.loads(args.json.read_text()) if args.json.exists() else {}
    if not args.render:
        run_all(measured, args.only, args.remeasure, args.json)
    text = render(measured)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
