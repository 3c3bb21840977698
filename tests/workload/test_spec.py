"""Workload model: parameter counts equal transformers' to the parameter, bad input names its field."""

import json
from dataclasses import replace

import pytest

from tuner.workload import (
    SUPPORTED_FAMILIES,
    ClusterSpec,
    TrainSpec,
    Workload,
    WorkloadError,
    check_config_limits,
    load_builtin_model,
    model_from_hf_config,
    model_from_param_count,
    preset_config,
    preset_names,
    workload_from_dict,
    workload_to_dict,
)

EXTRA_CONFIGS = {
    "gpt_neox": {
        "model_type": "gpt_neox",
        "vocab_size": 50304,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "max_position_embeddings": 2048,
    },
    "gpt_neox-tied-nobias": {
        "model_type": "gpt_neox",
        "vocab_size": 1000,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "attention_bias": False,
        "tie_word_embeddings": True,
    },
    "llama-biases-headdim": {
        "model_type": "llama",
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 344,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "head_dim": 64,
    },
    "gpt2-untied-inner": {
        "model_type": "gpt2",
        "vocab_size": 1000,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": 300,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
    },
    "qwen2-untied": {
        "model_type": "qwen2",
        "vocab_size": 2000,
        "hidden_size": 128,
        "intermediate_size": 300,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
    },
    "mistral-headdim": {
        "model_type": "mistral",
        "vocab_size": 2000,
        "hidden_size": 128,
        "intermediate_size": 300,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 48,
    },
}
# The formula families; presets of other architectures are counted by transformers itself (tests/test_profile.py).
FORMULA_PRESETS = [name for name in preset_names() if preset_config(name)["model_type"] in SUPPORTED_FAMILIES]
CONFIGS = {**{name: preset_config(name) for name in FORMULA_PRESETS}, **EXTRA_CONFIGS}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_count_equals_transformers(name: str) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = CONFIGS[name]
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    expected = sum(p.numel() for p in model.parameters())
    assert model_from_hf_config(config, name).n_params == expected


def test_known_sizes_of_presets() -> None:
    assert load_builtin_model("llama-2-7b").n_params == 6_738_415_616
    assert load_builtin_model("gpt2").n_params == 124_439_808
    assert load_builtin_model("llama-3-8b").n_params == 8_030_261_248


def test_config_file_and_folder(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(preset_config("tiny-llama")))
    assert load_builtin_model(str(tmp_path)).n_params == load_builtin_model("tiny-llama").n_params
    assert load_builtin_model(str(tmp_path / "config.json")).family == "llama"


@pytest.mark.parametrize(
    ("source", "field"),
    [("no-such-preset", "model"), ("/nonexistent/config.json", "model")],
)
def test_bad_model_source_names_field(source: str, field: str) -> None:
    with pytest.raises(WorkloadError) as error:
        load_builtin_model(source)
    assert error.value.field == field


def test_bad_config_values_name_the_key(tmp_path) -> None:
    with pytest.raises(WorkloadError, match=r"model\.model_type"):
        model_from_hf_config({"model_type": "t5"})
    with pytest.raises(WorkloadError, match=r"model\.hidden_size"):
        model_from_hf_config({**preset_config("tiny-llama"), "hidden_size": -1})
    with pytest.raises(WorkloadError, match=r"model\.num_key_value_heads"):
        model_from_hf_config({**preset_config("tiny-llama"), "num_key_value_heads": 3})
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(WorkloadError, match="cannot read"):
        load_builtin_model(str(path))


def test_bare_parameter_count() -> None:
    spec = model_from_param_count(7.5e9)
    assert spec.n_params == 7_500_000_000 and spec.is_bare
    for bad in (0, -5, float("nan")):
        with pytest.raises(WorkloadError, match="params"):
            model_from_param_count(bad)


def test_cluster_and_train_validation() -> None:
    assert ClusterSpec(gpus_per_node=8, nodes=4).world_size == 32
    with pytest.raises(WorkloadError, match="gpus-per-node"):
        ClusterSpec(gpus_per_node=0)
    with pytest.raises(WorkloadError, match="gpu-memory"):
        ClusterSpec(gpu_memory=-1)
    with pytest.raises(WorkloadError, match="precision"):
        TrainSpec(precision="int8")
    with pytest.raises(WorkloadError, match="seq-len"):
        TrainSpec(seq_len=0)


def test_fingerprint_is_stable_and_ignores_name() -> None:
    a = Workload(model_from_hf_config(preset_config("tiny-gpt2"), "a"))
    b = Workload(model_from_hf_config(preset_config("tiny-gpt2"), "b"))
    c = Workload(model_from_hf_config(preset_config("tiny-gpt2"), "a"), train=TrainSpec(seq_len=128))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert len(a.fingerprint()) == 16


def test_fingerprints_are_those_workloads_were_stored_under_before_the_trial_config() -> None:
    """Micro-batch, accumulation and checkpointing left the workload for the trial config: fingerprints of stored
    workloads do not change (the values the code before computed), and an old stored dict,
    whose ``train`` still holds them, loads."""
    gpt2 = Workload(load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=8), TrainSpec(seq_len=1024))
    assert gpt2.fingerprint() == "aa2935f545e97b9d"
    bare = Workload(
        model_from_param_count(7e9),
        ClusterSpec(gpus_per_node=2, device="cpu"),
        TrainSpec(seq_len=64, precision="fp32", attention="eager"),
    )
    assert bare.fingerprint() == "9e7f4a05b86ec881"
    old = workload_to_dict(gpt2)
    old["train"] = {**old["train"], "micro_batch": 4, "grad_accum": 2, "activation_checkpointing": True}
    assert workload_from_dict(old) == gpt2
    assert "micro_batch" not in workload_to_dict(gpt2)["train"]


def test_counts_are_per_layer_kind_without_a_per_layer_list() -> None:
    """A billion layers are counted by arithmetic (no per-layer list, which would take gigabytes): the shapes are
    one block's times the layer count, and equal the materialised list's for a real size."""
    llama = model_from_hf_config(preset_config("llama-2-7b"))
    counted: dict[int, int] = {}
    for numel in llama.param_numels:
        counted[numel] = counted.get(numel, 0) + 1
    assert dict(llama.param_shapes) == counted and sum(llama.param_numels) == llama.n_params
    huge = replace(llama, num_layers=10**9)
    per_layer = (llama.n_params - 2 * 32000 * 4096 - 4096) // 32
    assert huge.n_params == 10**9 * per_layer + 2 * 32000 * 4096 + 4096
    assert huge.largest_param == llama.largest_param
    assert dict(huge.param_shapes)[4096 * 4096] == 4 * 10**9
    assert "param_numels" not in huge.__dict__  # the cached per-tensor list was never built


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_hidden_layers": 10**9}, "model.num_hidden_layers"),
        ({"num_hidden_layers": 1e7}, "model.num_hidden_layers"),
        ({"hidden_size": 2**17 + 1}, "model.hidden_size"),
        ({"intermediate_size": 2**30}, "model.intermediate_size"),
        ({"num_attention_heads": 10**6}, "model.num_attention_heads"),
        ({"vocab_size": 2**40}, "model.vocab_size"),
        ({"max_position_embeddings": 2**40}, "model.max_position_embeddings"),
        ({"num_local_experts": 10**6}, "model.num_local_experts"),
        ({"text_config": {"num_hidden_layers": 10**9}}, "model.text_config.num_hidden_layers"),
    ],
)
def test_config_limits_name_the_field_before_any_work(change: dict, field: str) -> None:
    with pytest.raises(WorkloadError) as caught:
        check_config_limits({**preset_config("llama-2-7b"), **change})
    assert caught.value.field == field and "must be at most" in caught.value.message
    with pytest.raises(WorkloadError) as built:  # the built-in model checks them before counting
        model_from_hf_config({**preset_config("llama-2-7b"), **change})
    assert built.value.field == field


def test_config_limits_pass_every_preset_and_refuse_deep_nesting() -> None:
    for name in preset_names():
        check_config_limits(preset_config(name))
    deep: dict = {}
    for _ in range(10):
        deep = {"sub": deep}
    with pytest.raises(WorkloadError, match="nested deeper"):
        check_config_limits(deep)


def test_trainable_part_round_trips_and_leaves_full_fine_tuning_fingerprints_alone() -> None:
    from tuner.workload import TrainableSpec, workload_from_dict, workload_to_dict

    full = Workload(load_builtin_model("tiny-gpt2"))
    lora = replace(full, trainable=TrainableSpec.of({"r": 8, "peft_type": "LORA"}, "wte"))
    assert "trainable" not in workload_to_dict(full)
    assert workload_from_dict(workload_to_dict(lora)) == lora
    assert lora.fingerprint() != full.fingerprint()
    # key order of the adapter config does not matter
    assert TrainableSpec.of({"peft_type": "LORA", "r": 8}) == TrainableSpec.of({"r": 8, "peft_type": "LORA"})
    with pytest.raises(WorkloadError, match="freeze"):
        TrainableSpec(freeze="[")
    with pytest.raises(WorkloadError, match="peft"):
        TrainableSpec(peft="[1]")
