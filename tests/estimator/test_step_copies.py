"""ZeRO-1/2's step without offload holds the rank's 16-bit gradient buffer beside the gradient norm's fp64 slices and
beside the flat 16-bit partition and its cast to the master's dtype (pure arithmetic; the truth it was checked against
is the counting allocator's peak in ``bench/precision_true_peak.py``'s seq-32 rows,
``tests/estimator/test_precision_true_peak.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from tuner.estimator import estimate, resolve
from tuner.estimator.states.muon import muon_flat_partition, muon_updates
from tuner.estimator.states.partitions import flat_partition
from tuner.estimator.states.transients import flat_step_copies, offload_reduce_moment
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model, numerics_config

GPUS = 8
WORK = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=GPUS), TrainSpec(seq_len=512))


def test_the_larger_of_the_norm_and_the_cast_moment() -> None:
    """fp32 master: the flat 16-bit copy and its fp32 cast beside the 16-bit buffer; bf16 master: the cast is the
    flat copy itself, so the norm's fp64 slice of the largest parameter can be the larger moment."""
    assert flat_step_copies(2, 4, 1_000, (900,), 100) == 2 * 1_000 + 2 * 900 + 4 * 900 - 4 * 900
    assert flat_step_copies(2, 2, 1_000, (900,), 800) == 2 * 1_000 + 8 * 800 - 2 * 900
    assert flat_step_copies(2, 2, 1_000, (900,), 100) == 2 * 1_000  # the cast moment: the buffer beside the flat copy
    # one group cast at a time: Muon's and Adam's groups never hold their copies together
    assert flat_step_copies(2, 4, 1_000, (600, 300), 10) == 2 * 1_000 + 6 * 600 - 4 * 900


def config(stage: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    base: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
    }
    for key, value in (extra or {}).items():
        base[key] = {**base.get(key, {}), **value}
    return base


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("master", [4, 2])
def test_the_step_phase_holds_the_moment_at_any_scale(stage: int, master: int) -> None:
    """Llama-2-7B on 8 ranks: the step phase is the parameters, the optimizer states, the gradient partition in the
    master's dtype and the step's copies of the 16-bit gradients (the 32,000 × 4,096 embedding's fp64 slice of the
    partition where the master is bf16)."""
    extra = numerics_config(bf16_master=True, bf16_optimizer_states=True) if master == 2 else None
    est = estimate(WORK, config(stage, extra))
    flat = flat_partition(WORK.model.param_numels, GPUS)
    largest = min(max(WORK.model.param_numels), flat.partition)
    copies = flat_step_copies(2, master, flat.worst_rank_grads, (flat.partition,), largest)
    step = est.phases["step"].gpu
    assert step["gradients"] == master * flat.partition
    assert step["buffers"] == copies
    assert est.details["gradient_copies"] == copies > 0


def test_muons_orthogonalised_gradients_sit_beside_both_moments() -> None:
    """Muon's group keeps what ``muon_update`` returned until the step casts it: at the norm and at the cast."""
    assert flat_step_copies(2, 4, 1_000, (900,), 100, beside=300) == flat_step_copies(2, 4, 1_000, (900,), 100) + 300


@pytest.mark.parametrize("stage", [1, 2])
def test_offloads_reduction_holds_the_norms_fp64_slice(stage: int) -> None:
    """ZeRO-1/2 with optimizer offload: backward holds the largest gradient slice's fp64 copy for its norm (8 B an
    element), and at ZeRO-2 the gradient itself when it is larger than the reduce bucket (it bypasses the bucket)."""
    assert offload_reduce_moment(1_000, 2, 600, 2_000, stage) == 8 * 600
    own = 2 * 1_000 if stage == 2 else 0  # ZeRO-1's backward phase holds every 16-bit gradient already
    assert offload_reduce_moment(1_000, 2, 600, 500, stage) == 8 * 600 + own
    extra = {"zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu"}}}
    est = estimate(WORK, config(stage, extra))
    flat = flat_partition(WORK.model.param_numels, GPUS)
    largest = max(WORK.model.param_numels)  # the 32,000 × 4,096 embedding, within the default 5e8-element bucket
    assert est.details["offload_reduce"] == offload_reduce_moment(largest, 2, flat.partition, 500_000_000, stage)
    assert est.details["offload_reduce"] == 8 * min(largest, flat.partition)


def test_muons_step_moment_in_the_estimate() -> None:
    """Muon at ZeRO-1 (its two groups cast one at a time) with its orthogonalised gradients beside the moment."""
    est = estimate(WORK, config(1, numerics_config(optimizer="muon")))
    numels = WORK.model.param_numels
    s = resolve(WORK, TrialConfig(config(1, numerics_config(optimizer="muon"))))
    flat = muon_flat_partition(WORK.model, numels, s)
    updates = muon_updates(WORK.model, numels, s, 2)
    largest = min(max(numels), flat.largest_group)
    assert len(flat.groups) == 2 and updates > 0
    copies = flat_step_copies(2, 4, flat.worst_rank_grads, flat.groups, largest, updates)
    assert est.details["gradient_copies"] == copies
