"""Layout and long-context validation (pure): one line naming the field, as DeepSpeed 0.19.8's Ulysses and ALST
accept them (tuner.workload.long_context_checks)."""

from __future__ import annotations

import pytest

from tuner.workload import (
    ClusterSpec,
    ConfigError,
    TrainSpec,
    TrialConfig,
    Workload,
    check_long_context,
    kv_replication,
    load_builtin_model,
    model_from_hf_config,
    sequence_parallel_problem,
)

GQA = {  # 8 query heads, 2 key-value heads
    "model_type": "llama",
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}


def work(gpus: int = 8, seq: int = 4096, attention: str = "sdpa", config: dict | None = None) -> Workload:
    model = model_from_hf_config(config) if config else load_builtin_model("llama-2-7b")
    return Workload(model, ClusterSpec(gpus_per_node=gpus), TrainSpec(seq_len=seq, attention=attention))


@pytest.mark.parametrize(
    ("workload", "ds_config", "checkpointing", "field", "words"),
    [
        (work(gpus=6), {"sequence_parallel_size": 4}, False, "sequence_parallel_size", "must divide the 6 ranks"),
        (work(gpus=12), {"sequence_parallel_size": 12}, False, "sequence_parallel_size", "32 attention heads"),
        (work(seq=4100), {"sequence_parallel_size": 8}, False, "sequence_parallel_size", "sequence length 4100"),
        (work(attention="eager"), {"sequence_parallel_size": 2}, False, "sequence_parallel_size", "eager"),
        (work(gpus=4, seq=64), {"sequence_parallel_size": 4, "dstune": {"tiled_mlp_shards": 32}}, False,
         "dstune.tiled_mlp_shards", "exceed the 16 tokens"),
        (work(seq=64), {"dstune": {"tiled_loss_shards": 65}}, False, "dstune.tiled_loss_shards", "64 tokens"),
        (work(), {"dstune": {"offload_checkpoints": True}}, False, "dstune.offload_checkpoints", "checkpointing"),
    ],
)  # fmt: skip
def test_bad_layouts_are_refused_naming_the_field(
    workload: Workload, ds_config: dict, checkpointing: bool, field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        check_long_context(workload, TrialConfig(ds_config, checkpointing))
    assert caught.value.field == field
    assert words in caught.value.message and "\n" not in str(caught.value)


def test_key_value_heads_divide_sp_or_sp_divides_them() -> None:
    """DeepSpeed: kv % sp == 0 or sp % kv == 0; fewer kv heads than sp are replicated sp / kv times."""
    three_kv = {**GQA, "hidden_size": 384, "num_attention_heads": 12, "num_key_value_heads": 3}
    assert sequence_parallel_problem(work(gpus=4, config=three_kv), 4) is not None  # 12 % 4 == 0 but 3 vs 4
    assert "key-value heads" in str(sequence_parallel_problem(work(gpus=4, config=three_kv), 4))
    assert sequence_parallel_problem(work(gpus=8, config=GQA), 8) is None  # 2 kv heads, each repeated 4 times
    assert kv_replication(2, 8) == 4 and kv_replication(8, 2) == 1
    check_long_context(work(config=GQA), TrialConfig({"sequence_parallel_size": 8}))


def test_valid_long_context_trials_pass() -> None:
    trial = TrialConfig(
        {"sequence_parallel_size": 4, "dstune": {"tiled_mlp_shards": 8, "offload_checkpoints": True}}, True
    )
    check_long_context(work(), trial)
