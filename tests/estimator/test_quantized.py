"""QLoRA (a 4-bit bitsandbytes base) and ``zero_quantized_nontrainable_weights``: estimate only, so checked here
against bytes derived by hand from bitsandbytes' and DeepSpeed's layouts (``tuner/estimator/states/quantized.py``).

tiny-llama (hidden 128, 4 heads of 32, 2 KV heads, MLP 344, vocabulary 1024, 4 layers, untied) with LoRA r=8 on
q_proj and v_proj. Each layer's seven ``nn.Linear`` weights are quantized: q_proj and o_proj 128×128 = 16,384,
k_proj and v_proj 64×128 = 8,192, gate/up/down 344×128 = 44,032 elements: 181,248 a layer, 724,992 in all. The
embedding and the LM head (131,072 each) and nine norms of 128 stay bf16 (263,296); the adapters (14,336) are fp32.

Per weight of ``n`` elements (blocks of 64): packed ``n/2`` bytes; quant state ``4·⌈n/64⌉ + 64`` (fp32 absmax and
the 16-entry fp32 code), or with double quant ``⌈n/64⌉ + 4·⌈⌈n/64⌉/256⌉ + 4 + 64`` (plus the shared 1,024-byte
dynamic map once):

=========  ======  ======  ===========  ==========
weight     n       packed  state        state (dq)
=========  ======  ======  ===========  ==========
q, o       16384   8192    1088         328
k, v       8192    4096    576          200
mlp ×3     44032   22016   2816         768
=========  ======  ======  ===========  ==========

A layer: packed 90,624, state 11,776 (3,360 with double quant); four layers: 362,496 + 47,104 = 409,600
(362,496 + 13,440 + 1,024 = 376,960 with double quant).
"""

from __future__ import annotations

import math

import pytest

from tuner.errors import InputError
from tuner.estimator import ConfigError, estimate
from tuner.estimator.states.quantized import packed_bytes, quantizer_groups, state_bytes
from tuner.requests import FieldError, WorkloadRequest, to_workload
from tuner.workload import QuantSpec, TrainableSpec, WorkloadError, preset_config, workload_from_dict, workload_to_dict

pytest.importorskip("peft")

LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
NF4 = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
BF16_STORAGE = {**NF4, "bnb_4bit_quant_storage": "bfloat16"}
QUANTIZED = 724_992
PACKED = QUANTIZED // 2  # 362,496
STATE = 47_104
STATE_DQ = 13_440 + 1_024
KEPT_BF16 = 263_296  # embedding, LM head, norms
ADAPTERS = 14_336  # fp32 trainable


def workload(quantization: dict | None = NF4, device: str = "cuda", gpus: int = 2):
    return to_workload(
        WorkloadRequest(model="tiny-llama", gpus=gpus, device=device, peft=LORA, quantization=quantization)
    )


def config(stage: int, **zero: object) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage, **zero},
    }


def test_per_weight_bytes_follow_bitsandbytes_layout() -> None:
    for n, packed, state, state_dq in ((16384, 8192, 1088, 328), (8192, 4096, 576, 200), (44032, 22016, 2816, 768)):
        for storage in ("uint8", "bfloat16", "float16", "float32"):
            assert packed_bytes(n, storage) == packed  # half a byte per element, whatever tensor holds it
        assert state_bytes(n, False) == state and state_bytes(n, True) == state_dq


def test_quantized_weights_are_the_ones_transformers_replaces() -> None:
    from tuner.profile.hf import describe_trained

    peft = TrainableSpec.of(LORA, None, QuantSpec.of(NF4))
    profile = describe_trained(preset_config("tiny-llama"), peft)
    quantized = [n for n, q in zip(profile.param_numels, profile.quantized, strict=True) if q]
    assert len(quantized) == 28 and sum(quantized) == QUANTIZED  # 7 linears × 4 layers; not lm_head, not adapters
    assert not any(q and t for q, t in zip(profile.quantized, profile.trainable, strict=True))
    # llm_int8_skip_modules replaces transformers' default skips: down_proj stays bf16, the LM head is quantized
    skip = TrainableSpec.of(LORA, None, QuantSpec.of({**NF4, "llm_int8_skip_modules": ["down_proj"]}))
    skipped = describe_trained(preset_config("tiny-llama"), skip)
    assert sum(n for n, q in zip(skipped.param_numels, skipped.quantized, strict=True) if q) == (
        QUANTIZED - 4 * 44032 + 1024 * 128
    )


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_zero_0_to_2_hold_packed_data_and_state_whole(stage: int) -> None:
    est = estimate(workload(), config(stage))
    plain = estimate(workload(None), config(stage))
    params = est.phases["step"].gpu["parameters"]
    # adapters in bf16 (stage 0 casts them; 1-2 hold the flat bf16 group: 14,336 is a multiple of 2 × 2 ranks)
    assert params == 2 * ADAPTERS + 2 * KEPT_BF16 + PACKED + STATE == 964_864
    assert plain.phases["step"].gpu["parameters"] == 2 * ADAPTERS + 2 * (KEPT_BF16 + QUANTIZED)
    assert est.details["quantized_weights"] == PACKED + STATE
    assert est.per_gpu["optimizer_states"] == plain.per_gpu["optimizer_states"]  # adapters' states unchanged


def test_double_quant_shrinks_the_state() -> None:
    est = estimate(workload({**NF4, "bnb_4bit_use_double_quant": True}), config(2))
    assert est.details["quantized_weights"] == PACKED + STATE_DQ
    assert est.phases["step"].gpu["parameters"] == 2 * ADAPTERS + 2 * KEPT_BF16 + PACKED + STATE_DQ


def test_zero3_partitions_packed_data_only_in_a_floating_storage() -> None:
    # shards over 2 ranks: embedding and LM head 65,536 bf16 each, norms 64 bf16, fp32 adapters (1024, 1024, 1024,
    # 512 a layer) halved at 4 bytes
    others = 2 * 65536 * 2 + 9 * 64 * 2 + 4 * (512 + 512 + 512 + 256) * 4
    uint8, bf16 = estimate(workload(NF4), config(3)), estimate(workload(BF16_STORAGE), config(3))
    assert uint8.details["quantized_weights_whole"] == PACKED + STATE  # uint8: whole on every rank
    assert uint8.phases["step"].gpu["parameters"] == others + PACKED + STATE == 701_568
    assert bf16.details["quantized_weights_whole"] == STATE  # the quant state is never partitioned
    assert bf16.phases["step"].gpu["parameters"] == others + PACKED // 2 + STATE == 520_320


def test_saving_gathers_the_packed_data() -> None:
    est = estimate(workload(BF16_STORAGE), config(3, stage3_gather_16bit_weights_on_model_save=True))
    assert est.details["save_gathered_model"] == 2 * KEPT_BF16 + PACKED  # the base as saved: bf16 and 4-bit


def test_backward_holds_one_dequantized_weight() -> None:
    # the largest (44,032): loaded bf16, copied to the compute dtype (float32 by default; bf16 needs no copy)
    assert estimate(workload(), config(2)).details["dequantized_weight"] == 44032 * (2 + 4)
    bf16 = estimate(workload({**NF4, "bnb_4bit_compute_dtype": "bfloat16"}), config(2))
    assert bf16.details["dequantized_weight"] == 44032 * 2


def test_json_marks_estimate_only_with_why() -> None:
    quantized, plain = estimate(workload(), config(3)).to_dict(), estimate(workload(None), config(3)).to_dict()
    assert quantized["estimate_only"] is True and "bitsandbytes" in quantized["estimate_only_why"]
    assert plain["estimate_only"] is False and plain["estimate_only_why"] is None


def test_qlora_on_cpu_is_refused_naming_the_field() -> None:
    with pytest.raises(FieldError) as refused:
        workload(device="cpu")
    assert refused.value.loc == ("quantization",) and "CUDA" in refused.value.message
    with pytest.raises(FieldError) as inline:  # the model config's own quantization_config
        to_workload(
            WorkloadRequest(config={**preset_config("tiny-llama"), "quantization_config": NF4}, device="cpu", peft=LORA)
        )
    assert inline.value.loc == ("config", "quantization_config")


def test_model_config_quantization_config_is_read() -> None:
    inline = to_workload(
        WorkloadRequest(config={**preset_config("tiny-llama"), "quantization_config": NF4}, gpus=2, peft=LORA)
    )
    assert inline.trainable.quant == QuantSpec.of(NF4)
    assert estimate(inline, config(2)).details["quantized_weights"] == PACKED + STATE


@pytest.mark.parametrize(
    ("quantization", "field"),
    [
        ({**NF4, "quant_method": "gptq"}, "quantization.quant_method"),
        ({**NF4, "bnb_4bit_quant_type": "int4"}, "quantization.bnb_4bit_quant_type"),
        ({**NF4, "bnb_4bit_quant_storage": "int32"}, "quantization.bnb_4bit_quant_storage"),
        ({**NF4, "bnb_4bit_compute_dtype": "int8"}, "quantization.bnb_4bit_compute_dtype"),
        ({"load_in_8bit": True}, "quantization.load_in_8bit"),
        ({"bnb_4bit_quant_type": "nf4"}, "quantization.load_in_4bit"),
        ({**NF4, "bnb_4bit_blocksize": 128}, "quantization.bnb_4bit_blocksize"),
    ],
)
def test_bad_quantization_names_the_field(quantization: dict, field: str) -> None:
    with pytest.raises(InputError) as refused:
        QuantSpec.of(quantization)
    assert refused.value.field == field
    with pytest.raises(FieldError) as request:
        workload(quantization)
    assert ".".join(map(str, request.value.loc)) == field


def test_a_measured_run_refuses_a_4bit_base() -> None:
    from tuner.measure.run import run_measurement
    from tuner.workload import TrialConfig

    with pytest.raises(InputError) as refused:  # before any rank starts: it would train the unquantized model
        run_measurement(workload(), TrialConfig(config(2)))
    assert refused.value.field == "quantization"


def test_fingerprint_and_stored_round_trip() -> None:
    quantized, plain = workload(), workload(None)
    assert quantized.fingerprint() != plain.fingerprint()
    assert "quantization" not in workload_to_dict(plain)["trainable"]  # LoRA workloads keep their fingerprints
    assert workload_from_dict(workload_to_dict(quantized)).trainable == quantized.trainable


def test_quantization_needs_an_adapter() -> None:
    with pytest.raises(WorkloadError, match="peft"):
        TrainableSpec.of(None, None, QuantSpec.of(NF4))


def deepspeed_groups(numel: int) -> int:
    """``CUDAQuantizer.quantize``'s group search as DeepSpeed 0.19.8 writes it (partition_parameters.py)."""
    groups = math.ceil(numel / 8000)
    while groups < numel:
        if numel % (8 * groups) == 0:
            break
        groups += 1
    while numel % (8 * groups * 2) == 0 and numel / groups > 8000:
        groups *= 2
    return groups


@pytest.mark.parametrize("numel", [64, 4096, 8192, 22016, 65536, 10**6, 8 * 1009 * 7, 2**24, 8 * 3 * 5 * 7 * 11 * 13])
def test_quantizer_groups_follow_deepspeed(numel: int) -> None:
    assert quantizer_groups(numel) == deepspeed_groups(numel)


def test_zero_quantized_nontrainable_weights_holds_frozen_shards_int8() -> None:
    peft = workload(None)
    plain, quantized = estimate(peft, config(3)), estimate(peft, config(3, zero_quantized_nontrainable_weights=True))
    # frozen shards over 2 ranks: 494,144 elements; DeepSpeed's groups: 16 for each 65,536 (embedding, LM head),
    # 1 per norm (9), and per layer 2 + 1 + 1 + 2 (attention) + 4 × 3 (MLP): 32 + 9 + 72 = 113 fp32 scales
    saved = 494_144 - 4 * 113
    assert quantized.details["quantized_nontrainable_saving"] == saved
    assert quantized.phases["step"].gpu["parameters"] == plain.phases["step"].gpu["parameters"] - saved
    assert quantized.to_dict()["estimate_only"] and not plain.to_dict()["estimate_only"]
    # ZeRO 0-2: DeepSpeed ignores it
    assert not estimate(peft, config(2, zero_quantized_nontrainable_weights=True)).estimate_only


def test_zero_quantized_nontrainable_weights_refused_on_cpu_and_with_a_4bit_base() -> None:
    on_cpu = to_workload(WorkloadRequest(model="tiny-llama", gpus=2, device="cpu", peft=LORA))
    with pytest.raises(ConfigError) as refused:
        estimate(on_cpu, config(3, zero_quantized_nontrainable_weights=True))
    assert refused.value.field == "zero_optimization.zero_quantized_nontrainable_weights"
    with pytest.raises(ConfigError, match="4-bit"):
        estimate(workload(), config(3, zero_quantized_nontrainable_weights=True))
