"""What a measured run refuses of the long-context settings: one line naming the field, before any rank starts."""

from __future__ import annotations

import pytest

from tuner.errors import InputError
from tuner.measure.run import run_measurement
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model, preset_config

pytest.importorskip("transformers")


def workload(implementation: str = "transformers", attention: str = "sdpa") -> Workload:
    model = load_builtin_model("tiny-llama")
    if implementation == "transformers":
        from tuner.profile.describe import model_from_config

        model = model_from_config(preset_config("tiny-llama"), "tiny-llama")
    return Workload(model, ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len=64, attention=attention))


@pytest.mark.parametrize(
    ("impl", "attention", "config", "checkpointing", "field"),
    [
        ("builtin", "sdpa", {"sequence_parallel_size": 2}, False, "sequence_parallel_size"),
        ("builtin", "sdpa", {"dstune": {"tiled_mlp_shards": 2}}, False, "dstune.tiled_mlp_shards"),
        ("transformers", "sdpa", {"dstune": {"offload_checkpoints": True}}, True, "dstune.offload_checkpoints"),
        ("transformers", "eager", {"sequence_parallel_size": 2}, False, "attention"),
        ("transformers", "sdpa", {"dstune": {"tiled_loss_shards": 128}}, False, "dstune.tiled_loss_shards"),
    ],
)
def test_unmeasurable_long_context_settings_are_refused_before_any_rank(
    impl: str, attention: str, config: dict, checkpointing: bool, field: str
) -> None:
    with pytest.raises(InputError) as refused:
        run_measurement(workload(impl, attention), TrialConfig(config, checkpointing))
    assert refused.value.field == field
    assert "\n" not in str(refused.value)
