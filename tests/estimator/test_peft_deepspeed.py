"""The estimator with a LoRA adapter against real DeepSpeed on 2 CPU ranks (gloo, bf16), so that it cannot drift.

Each case trains a tiny LLaMA-style model (or, at ZeRO-3, the tiny Mixtral-shaped MoE) with peft's LoRA on q_proj
and v_proj for two steps (the rank function of ``bench/peft_memory.py``: the adapter added after the base is built,
only trainable parameters given to the optimizer) and compares, for the worst rank: the trainable count with
DeepSpeed's, the model states the engine and optimizer hold (live storages,
:func:`tuner.measure.rank.memory_probe.classify_engine_memory`) within 1 %, and the true peak of live tensor bytes
(counted at torch's CPU allocator, :mod:`tuner.measure.rank.true_peak`) within 5 %. Small reduce buckets, so that states
and activations, not a 1 GB bucket, set the peak.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peft_memory

from tuner.estimator import estimate

pytestmark = pytest.mark.deepspeed
# What every rank imports before it builds anything: loaded once, by the fork server the ranks are forked from.
PRELOAD = ["torch", "deepspeed", "transformers", "peft", "peft_memory"]


@pytest.fixture(scope="module", autouse=True)
def ranks_forked_from_one_server() -> Iterator[None]:
    """``peft_memory.measure``'s ranks (its rank function, its spec), forked from one multiprocessing fork server
    that imported torch, DeepSpeed, transformers and peft once for the module, instead of each of the 10 ranks of
    these 5 runs spawning a fresh interpreter that imports them all again (about 10 s a rank on 2 cores). Nothing is
    built or initialised before the fork: each rank builds its model, starts the allocator count and initialises
    DeepSpeed itself, as the product's own fork server does (``tests/measure/test_runner.py`` checks that a forked
    rank measures the same bytes as a fresh one)."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    start_processes = mp.start_processes

    def forked(*args: Any, **kwargs: Any) -> Any:
        return start_processes(*args, **{**kwargs, "start_method": "forkserver"})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mp, "start_processes", forked)
        yield


@pytest.mark.parametrize(
    ("model", "stage"), [("tiny-llama", 1), ("tiny-llama", 2), ("tiny-llama", 3), ("tiny-mixtral", 3)]
)
def test_lora_estimate_matches_deepspeed(model: str, stage: int) -> None:
    """ZeRO-3: frozen weights partitioned, small parameters (all the adapters) persistent and whole, peft's fp32
    adapters kept fp32, every Linear saving its input; on the MoE forward keeps the fused experts gathered (both
    measured within 0.3 % in ``bench/results/peft_memory.md``; it was 4-35 % under before)."""
    work = peft_memory.workload(model)
    config = peft_memory.ds_config(stage, peft_memory.VARIANTS["small_buckets"])
    ranks = peft_memory.measure(work, config)
    est = estimate(work, config)
    assert est.trainable_params == ranks[0]["trainable_numel"] == 4 * 8 * (256 + 192)
    held = max(peft_memory.model_states(r["held"]) for r in ranks)
    assert abs(peft_memory.estimated_states(est) / held - 1) < 0.01
    if stage == 3:
        assert ranks[0]["param_elements"]["trainable_float32"] == est.details["trainable_partition_elements"]
    true = max(r["true_peak_bytes"] for r in ranks)
    assert abs((est.per_gpu["total"] or 0) / true - 1) < 0.05


def test_zero3_refuses_adapters_beside_modules_to_save() -> None:
    """peft's fp32 adapters beside a bf16 ``modules_to_save`` copy: DeepSpeed's stage-3 optimizer asserts one dtype
    (``defragment``), so the ranks fail, and the estimator refuses the config naming the field (a study prunes it).
    Fails when DeepSpeed learns to train them, and the refusal must go."""
    from tuner.estimator import ConfigError

    work = peft_memory.workload("tiny-llama", peft_memory.adapter("modules_to_save"))
    config = peft_memory.ds_config(3, peft_memory.VARIANTS["modules_to_save"])
    with pytest.raises(ConfigError, match="one dtype") as refused:
        estimate(work, config)
    assert refused.value.field == "zero_optimization.stage"
    with pytest.raises(Exception, match="AssertionError"):
        peft_memory.measure(work, config)
