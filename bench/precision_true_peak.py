"""bf16 master weights, bf16 optimizer states and Muon: the estimate against what DeepSpeed holds, on 2 CPU ranks.

Truth, two instruments: the model states DeepSpeed holds per rank after ``deepspeed.initialize`` and after two
steps, read from its optimizer's own tensors (the 16-bit parameters or shards, the master partition, every tensor
of the optimizer's state, ZeRO-3's gradient partition; elements and dtype each), and the true peak of live tensor
bytes (the counting allocator, :mod:`tuner.measure.rank.counting_allocator`, from before the model is built to the end
of the second step). The ranks are standalone gloo CPU ranks (:mod:`gloo_ranks`): a small LLaMA built by
transformers with random weights, bf16, small buckets, ZeRO 1-3 with and without optimizer offload to the CPU;
``bf16.bf16_master_weights_and_grads`` with and without ``bf16.bf16_optimizer_states`` (without offload DeepSpeed
0.19.8 takes the first only with the second), the fp32-master reference beside, and ``optimizer.type: "muon"``
at ZeRO-1/2. Seq 256 (and 32, where the model states set the peak), micro-batch 1; the loss's moment with Hugging
Face's and DeepSpeed's chunked loss at 2,048 tokens and a 65,536-token vocabulary.

Run: ``python bench/precision_true_peak.py [--only KEY] [--remeasure]``; results in
``bench/results/precision_true_peak.json`` and ``.md`` (rendered with the current estimator).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gloo_ranks

SEQ, SHORT, MICRO, BUCKET = 256, 32, 1, 500_000
REUSE = 3_000_000  # a stage3_max_reuse_distance below twice the model's 5.2M elements
LLAMA = {
    "model_type": "llama",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
LOSS_SEQ = 2048  # two of the chunked loss's blocks at this vocabulary (2^26 // 65,536 = 1,024 rows each)
WIDE_VOCAB = {  # the loss's moment is the peak: [tokens, vocab] logits dwarf the rest
    **LLAMA,
    "vocab_size": 65536,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}
PRECISIONS: dict[str, dict[str, Any]] = {
    "fp32-master": {},
    "bf16-master": {"bf16_master_weights_and_grads": True},
    "bf16-master+states": {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
}


def ds_config(case: dict[str, Any]) -> dict[str, Any]:
    """bf16 at ZeRO ``case["stage"]`` with small buckets, the case's master precision, optimizer and offload."""
    zero: dict[str, Any] = {}
    if case.get("offload"):
        zero["offload_optimizer"] = {"device": "cpu"}
    config = gloo_ranks.small_bucket_config(case["stage"], MICRO, BUCKET, **zero)
    config["bf16"] = {"enabled": True, **PRECISIONS[case["precision"]]}
    if "reuse" in case:  # below twice the model: forward keeps gathered only the parameters backward reuses soon
        config["zero_optimization"]["stage3_max_reuse_distance"] = case["reuse"]
    if case.get("optimizer") == "muon":
        config["optimizer"] = {"type": "Muon", "params": {"lr": 1e-3, "momentum": 0.95}}
    if case.get("chunked"):
        config["dstune"] = {"chunked_loss": True}  # estimated from the config; the ranks install it themselves
    return config


def model_config(case: dict[str, Any]) -> dict[str, Any]:
    """The case's transformers config."""
    return WIDE_VOCAB if case.get("model") == "wide" else LLAMA


def cases() -> list[dict[str, Any]]:
    """Each stage with and without offload, at each master precision DeepSpeed takes there; Muon at ZeRO-1/2."""
    found = []
    for stage in (1, 2, 3):
        for offload in (False, True):
            for precision in PRECISIONS:
                if precision == "bf16-master" and not offload:
                    continue  # DeepSpeed 0.19.8: bf16 master weights without offload need bf16 optimizer states
                found.append({"stage": stage, "offload": offload, "precision": precision, "world": 2})
    found += [
        {"stage": stage, "offload": False, "precision": "fp32-master", "world": 2, "optimizer": "muon"}
        for stage in (1, 2)
    ]
    # short sequences: the model states, not the loss, set the peak (in backward or the step)
    short = [(2, False, "fp32-master"), (2, False, "bf16-master+states"), (3, False, "bf16-master+states"),
             (2, True, "bf16-master"),
             (3, True, "bf16-master"), (1, True, "bf16-master+states")]  # fmt: skip
    found += [{"stage": st, "offload": off, "precision": p, "world": 2, "seq": SHORT} for st, off, p in short]
    found.append(
        {"stage": 1, "offload": False, "precision": "fp32-master", "world": 2, "optimizer": "muon", "seq": SHORT}
    )
    found.append({"stage": 3, "offload": False, "precision": "bf16-master+states", "world": 2, "reuse": REUSE})
    loss = {"stage": 2, "offload": False, "precision": "fp32-master", "world": 2, "seq": LOSS_SEQ, "model": "wide"}
    found += [{**loss, "chunked": chunked} for chunked in (False, True)]  # the loss's moment with either loss
    return found


def key(case: dict[str, Any]) -> str:
    optimizer = f"/{case['optimizer']}" if case.get("optimizer") else ""
    seq = f"/seq{case['seq']}" if case.get("seq", SEQ) != SEQ else ""
    seq += f"/reuse{case['reuse']}" if "reuse" in case else ""
    if "model" in case:
        return f"loss/{case['model']}/{'chunked' if case['chunked'] else 'hf'}/z{case['stage']}{seq}"
    return f"z{case['stage']}/{'offload' if case['offload'] else 'device'}/{case['precision']}{optimizer}{seq}"


def held_states(engine: Any) -> dict[str, dict[str, int]]:
    """The model states DeepSpeed's optimizer holds on this rank: name -> dtype -> elements."""
    import torch

    opt, held = engine.optimizer, {}

    def add(name: str, tensors: Any) -> None:
        for tensor in tensors:
            if torch.is_tensor(tensor) and tensor.numel() > 1:
                by_dtype = held.setdefault(name, {})
                by_dtype[str(tensor.dtype)] = by_dtype.get(str(tensor.dtype), 0) + tensor.numel()

    add("bit16", getattr(opt, "bit16_groups_flat", []))
    add("bit16", [p.ds_tensor for p in engine.module.parameters() if hasattr(p, "ds_tensor")])
    add(
        "master",
        getattr(opt, "single_partition_of_fp32_groups", None) or getattr(opt, "fp32_partitioned_groups_flat", []),
    )
    for state in opt.optimizer.state.values():
        for name, value in state.items():
            add(name, [value])
    add("grad_partition", [getattr(opt, "grad_partitions_flat_buffer", None)])
    add("muon_momentum", list(getattr(opt, "muon_momentum_buffer_partitioned_groups_flat", {}).values()))
    # Muon's staged momentum: the copy each step writes before committing it, outside the optimizer's state
    add("muon_staged", [staged for staged, _ in getattr(opt, "_muon_pending_momentum", {}).values()])
    return held


def rank_main(case: dict[str, Any], out: Path) -> None:
    """One rank of ``case``: build, initialise, note the states and live bytes, two steps, write the report."""
    import torch

    rank = gloo_ranks.join()
    ds = {key: value for key, value in ds_config(case).items() if key != "dstune"}

    def adapt(model: Any) -> None:
        if case.get("chunked"):
            from deepspeed.runtime.chunked_cross_entropy import install_chunked_causal_lm_loss

            install_chunked_causal_lm_loss(model)

    engine, tracker = gloo_ranks.counted_engine(ds, model_config(case), "PRECISION_BENCH_DETAIL", adapt=adapt)
    initialised = held_states(engine)
    live_after_init = tracker.counter.live - tracker.baseline if tracker.counter is not None else None
    seq = case.get("seq", SEQ)
    vocab = model_config(case)["vocab_size"]
    tokens = torch.randint(0, vocab, (MICRO, seq), generator=torch.Generator().manual_seed(rank))
    extra = {"states_after_init": initialised, "live_after_init": live_after_init}

    def loss() -> Any:
        return engine(input_ids=tokens, labels=tokens).loss

    # the states after two steps too: Muon's momentum appears in the first step
    gloo_ranks.train_and_report(
        engine, tracker, loss, out, extra, after=lambda: {"states_after_steps": held_states(engine)}
    )


def measure(case: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    """Start the case's ranks and collect their reports (:func:`gloo_ranks.run_ranks`)."""
    return gloo_ranks.run_ranks(__file__, case, timeout)


def estimate_case(case: dict[str, Any]) -> Any:
    """dstune's estimate of ``case`` (the workload carries the model's traced profile at ``SEQ``)."""
    name = case.get("model", "llama")
    return gloo_ranks.estimate_peak(model_config(case), name, case["world"], case.get("seq", SEQ), ds_config(case))


def process_peak(est: Any) -> int:
    """A CPU rank's estimated peak: device and host bytes are one process's memory there, so the largest phase sum
    of both."""
    return max(phase.gpu_total + phase.cpu_total for phase in est.phases.values())


def expected_states(case: dict[str, Any], est: Any) -> dict[str, dict[str, int]]:
    """The states the estimate says a rank's optimizer holds after its steps, as :func:`held_states` reads them:
    elements by dtype of the master partition and of each Adam moment (Muon's two groups are compared in bytes)."""
    from tuner.estimator import resolve
    from tuner.estimator.states.master_states import state_bytes
    from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, model_from_hf_config

    cluster = ClusterSpec(gpus_per_node=case["world"], device="cpu")
    work = Workload(model_from_hf_config(LLAMA, "llama"), cluster, TrainSpec(seq_len=case.get("seq", SEQ)))
    held = state_bytes(resolve(work, TrialConfig(ds_config(case))))
    dtype = {2: "torch.bfloat16", 4: "torch.float32"}
    part = est.details["partition_elements"]
    states = {"master": {dtype[held.master]: part}}
    if case.get("optimizer") != "muon":
        moment = dtype[held.moments // 2]
        states.update(exp_avg={moment: part}, exp_avg_sq={moment: part})
    return states


def state_bytes_held(states: dict[str, dict[str, int]]) -> int:
    """Bytes of the master partition and the optimizer's state tensors in ``states``."""
    size = {"torch.bfloat16": 2, "torch.float32": 4}
    return sum(
        size[d] * n for name, by in states.items() if name not in ("bit16", "grad_partition") for d, n in by.items()
    )


def row(case: dict[str, Any], case_key: str, data: dict[str, Any]) -> str:
    """One Markdown row: the estimate against the worst rank's true peak, and the states held against the
    estimate's (bytes of master and optimizer state, Muon's staged momentum among them; elements and dtypes where
    Adam's moments are compared)."""
    if data["status"] != "ok":
        return f"| {case_key} | {data['status']} | | | | | |"
    est = estimate_case(case)
    true = max(r["peak_bytes"] for r in data["ranks"])
    predicted = process_peak(est)
    worst = max(data["ranks"], key=lambda r: r["peak_bytes"])
    held = [state_bytes_held(r["states_after_steps"]) for r in data["ranks"]]
    step = est.phases["step"]
    states = step.gpu["optimizer_states"] + step.cpu["optimizer_states"]
    expected = expected_states(case, est)
    exact = all({k: v for k, v in r["states_after_steps"].items() if k in expected} == expected for r in data["ranks"])
    if case.get("optimizer") == "muon":  # both groups' masters, Adam's moments, the momentum and its staged copy
        exact = all(h == states for h in held)
    return (
        f"| {case_key} | {predicted / 2**20:.2f} | {true / 2**20:.2f} | {predicted / true - 1:+.2%} | "
        f"{worst['peak_during']} ({est.peak_phase}) | {held[0]:,} / {states:,} | {'yes' if exact else 'no'} |"
    )


def main() -> None:
    args, measured = gloo_ranks.bench_args(__doc__, "precision_true_peak", rank_main, md=True)
    rows = [row(case, case_key, measured[case_key]) for case, case_key, _ in gloo_ranks.measured_cases(
        cases(), key, measure, measured, args)]  # fmt: skip
    for line in rows:
        print(line, flush=True)
    header = (
        "| case | estimate MiB | true peak MiB | error | true peak during (estimated phase) | "
        "state bytes held / estimated | elements and dtypes as estimated |\n|---|---|---|---|---|---|---|"
    )
    text = f"# bf16 master weights, Muon and the chunked loss on 2 CPU ranks\n\n{__doc__.split(chr(10) * 2)[1]}\n\n"
    args.md.write_text(text + header + "\n" + "\n".join(rows) + "\n" + NOTES)


NOTES = """
Measured 2026-12-06 (DeepSpeed 0.19.8, torch 2.13 CPU, 2 shared cores).

* **The loss's moment at a long sequence and a large vocabulary** (`loss/wide/...`: 2,048 tokens, V = 65,536, a
  1-layer LLaMA of hidden size 64, ZeRO-2): Hugging Face's loss 1606.35 MiB estimated against 1606.34 true, DeepSpeed's
  chunked loss (installed with `install_chunked_causal_lm_loss`, two blocks of 1,024 rows) 1350.38 against 1350.37:
  both within 0.001 %, at the loss's backward.
* **The model states are held as estimated, to the element**, at every stage with and without offload: the master
  partition in bf16 with `bf16_master_weights_and_grads` (a second copy of the shard at ZeRO-3 too), Adam's moments
  in bf16 with `bf16_optimizer_states` and fp32 without it (DeepSpeedCPUAdam on the host), the partition's elements
  equal to the estimate's. Muon: the Adam group's master and moments, the Muon group's momentum and its staged copy
  (``_muon_pending_momentum``, outside the optimizer's state, read from the optimizer like the rest) equal the
  estimate's bytes.
* **ZeRO-1/2, seq 256 (the loss's moment sets the peak): within 0.01 %** for the fp32-master reference, bf16 master
  with and without bf16 states, with and without offload, and Muon.
* **ZeRO-3, seq 256: within 0.01 %** (was 6.5-9.2 % under, the fp32-master reference -7.39 % as much as the bf16
  rows: 5.54 MiB missing in all five, at the loss's backward). The allocator's sites alive at the peak (the rank with
  ``PRECISION_BENCH_DETAIL=stack``) hold every non-persistent parameter gathered: 15 ``all_gather_coalesced``
  buffers, 8,913,408 bytes in all (the embedding, the LM head and every MLP weight, 4,456,448 bf16 elements, and 512
  bytes more), while the estimate kept only the largest (2 MiB) plus a 500,000-element prefetch: it capped what
  forward keeps at ``stage3_max_live_parameters``, which in DeepSpeed 0.19.8 bounds the prefetch only. The release
  (``__params_to_release``) asks ``stage3_max_reuse_distance`` alone: a parameter stays gathered when its backward
  use comes within that many elements of the recorded module order (twice the parameters after it).
  `z3/.../reuse3000000` checks that rule below the model's size (a reuse distance of 3M elements: the LM head and
  the last layer's MLP, 1,638,400 elements, kept): 54.68 MiB estimated and true. The default-bucket rows of
  `estimator_true_peak.md` set max-live and the reuse distance to 1e9, so neither bit there (unchanged).
* **Seq 32, ZeRO-2 on the device (the optimizer step sets the peak): within 0.01 %** (were -16.8 % for the
  fp32-master reference and -13.2 % for bf16 master and states). The allocator's sites alive at the peak
  (``PRECISION_BENCH_DETAIL=stack``): DeepSpeed's step reads the rank's 16-bit gradient buffer (``grads_in_partition``,
  5,376,000 bytes on rank 0: the parameters overlapping its partition, whole) through ``averaged_gradients`` views
  that keep it alive until the cast: the fp32-master peak is the flat 16-bit partition ``flatten`` makes of it
  (5,245,184) and its fp32 ``.to()`` (10,490,368) beside that buffer; with bf16 master and states ``.to()`` returns the
  same tensor, and the peak is the gradient norm's fp64 copy of the embedding's gradient (``get_norm_dtype`` is fp64
  where the accelerator has it: 8,388,608 bytes) beside the buffer. The estimate's step held only the gradient
  partition in the master's dtype (:func:`tuner.estimator.states.transients.flat_step_copies`).
* **Seq 32, ZeRO-1/2 with optimizer offload (backward's copy of the gradients to the host sets the peak)**:
  `z1/offload/...` -13.80 % -> 0.00 %, `z2/offload/...` -15.35 % -> +0.18 %. Sites alive at the peak: the fp64 copy
  of a gradient's slice that ``set_norm_for_param_grad_in_gpu`` makes for its norm (the embedding's or the LM head's,
  8,388,608 bytes) and, at ZeRO-2, the LM head's gradient, larger than the bucket, cloned outside it
  (``extra_large_param_to_reduce`` under the offload's gradient protections, 2,097,152 bytes); at ZeRO-1 every 16-bit
  gradient beside them (it reduces after backward); at ZeRO-2 the worst rank is the one whose first reduction, the
  LM head's, comes while the activations are still alive
  (:func:`tuner.estimator.states.transients.offload_reduce_moment`).
* **Muon at seq 32: +2.86 % -> 0.00 %**, each phase as measured (the bench now records each phase's own high-water
  mark): the step 51.02 MiB estimated and true, holding what ``muon_update`` returned for the Muon group (3,145,728
  bytes, kept as its ``averaged_gradients``) beside the 16-bit buffer and the group's cast; backward 49.23 MiB both:
  its worst is ZeRO-1's reduction after backward (group by group, the Muon group first, each in model order: the
  partition allocated at the first layer's matrices, the other 16-bit gradients still alive), not Newton-Schulz on
  top of it (read with step 1's step left out, so that the sites alive at the peak were backward's).
* **Seq 32, ZeRO-3: -2.13 % -> -0.21 % on the device, -4.40 % -> +0.03 % with offload**, both at backward's start,
  where every parameter forward kept gathered is still whole (8,912,896 bytes; the estimate's backward phase held
  none, as at its last reduction). Found with module hooks marking each module's forward and backward and each
  reduction (a one-off probe, not part of this bench: the counting allocator's high-water mark between marks,
  both rows' peaks reproduced): the device row peaks inside the LM head's backward, 2,200,704 bytes above its start
  (the head's weight gradient, 2,097,152, its input's, 16,384, and 87,168 bytes not modelled), beside the saved
  activations less the loss's fp32 log-softmax (freed: 524,288) and the logits' bf16 gradient (262,144); the
  offload row at the head's reduction (the head alone, larger than the bucket, reduced when the final norm's
  gradient arrives, the head's module released by then), in ``_constant_buffered_norm2``'s fp64 copy of the head's
  gradient partition (4,194,304 bytes, ``stage3.py`` ``_offload_grad_partition_at_boundary``) beside the head's
  gradient (:mod:`tuner.estimator.activations.stage3_backward`). The 1,577,472 bytes of ``_allgather_params_coalesced``
  buffers alive at the peak are the persistent parameters (788,736 elements), counted already. Every other row is
  unchanged.
"""


if __name__ == "__main__":
    main()
