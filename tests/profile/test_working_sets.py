"""A decoder layer's worst backward moment traced under fake tensors, against the CPU allocator of the same layer
run for real (torch's profiler memory events: every allocation and free on this thread), and what the estimate does
with it under checkpointing."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import AutoConfig, AutoModelForCausalLM

from tuner.profile.autograd_saved import saved_bytes_by_layer
from tuner.profile.model_parts import decoder_layers
from tuner.profile.working_sets import layer_backward_peaks, pre_layer_bytes

QWEN2 = {
    "model_type": "qwen2",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}
SEQ, BATCH = 512, 2


def _model(fake: FakeTensorMode | None = None) -> Any:
    config = AutoConfig.for_model(**QWEN2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    if fake is None:
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()
    with fake:
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()


def _allocator_peak() -> tuple[int, int, int, int]:
    """The real layer's peak of bytes the allocator holds beyond what it held before the layer ran, over its forward
    and backward; the bytes of what the trace leaves out (the output and the gradient arriving at it), of what it
    counts that was made before the layer ran (the rotary tables it saves), and of its largest weight gradient
    (dropped once it is made, as ZeRO's hooks do: alive a moment)."""
    model = _model()
    layer = decoder_layers(model)[0]
    captured: dict[str, Any] = {}

    def grab(module: Any, args: Any, kwargs: Any) -> None:
        captured.update(args=list(args), kwargs=dict(kwargs))
        raise StopIteration

    handle = layer.register_forward_pre_hook(grab, with_kwargs=True)
    tokens = torch.randint(0, QWEN2["vocab_size"], (BATCH, SEQ))
    with pytest.raises(StopIteration):
        model(input_ids=tokens, labels=tokens)
    handle.remove()
    args, kwargs = captured["args"], captured["kwargs"]
    args[0] = args[0].detach().requires_grad_()
    for param in layer.parameters():
        param.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        output = layer(*args, **kwargs)
        output = output[0] if isinstance(output, tuple) else output
        torch.autograd.backward(output, torch.ones_like(output))
    events = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type().name == "CPU"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    weight_grad = max(param.numel() for param in layer.parameters()) * 2
    tables = sum(table.untyped_storage().nbytes() for table in kwargs["position_embeddings"])
    return peak, 2 * output.numel() * output.element_size(), tables, weight_grad


def test_the_traced_backward_peak_is_the_allocators() -> None:
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    model = _model(fake)
    with fake:
        traced, excess, outside_mlp, *_ = layer_backward_peaks(model, 0, BATCH, SEQ)
    real, left_out, tables, weight_grad = _allocator_peak()
    # the allocator holds the output and the incoming gradient beside the layer's own tensors (the trace leaves
    # them to the next layer), not the rotary tables made before (the trace counts what the layer saves); a weight
    # gradient alive for a moment is the only slack (measured: none)
    assert abs(traced - (real - left_out + tables)) <= weight_grad
    # the worst moment is above what the layer saves (what a recomputed layer was counted as before), by the excess
    saved = saved_bytes_by_layer(model, BATCH, SEQ, fake)[0]
    assert traced > 1.1 * saved
    assert excess == traced - saved
    # outside the MLP (a tiled MLP's layer) the worst moment is lower: the gated MLP's intermediates are gone
    assert 0 < outside_mlp < traced


QWEN2_MOE = {
    "model_type": "qwen2_moe",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}


def test_what_a_model_builds_before_its_layers_is_the_allocators() -> None:
    """Qwen2-MoE builds a sliding-window mask of s x s booleans that no layer uses (its window is 0): three such
    tensors at once while it does, one held through the layers. Truth: the allocator of the same forward pass run
    for real up to the first layer."""
    config = AutoConfig.for_model(**QWEN2_MOE)
    config._attn_implementation = "sdpa"
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with fake:
        peak, held = pre_layer_bytes(model, BATCH, SEQ)
    assert peak >= 3 * SEQ * SEQ and held >= SEQ * SEQ  # the mask, while it is built and after
    real = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()
    layer = decoder_layers(real)[0]

    def stop(*_: Any) -> None:
        raise StopIteration

    handle = layer.register_forward_pre_hook(stop)
    tokens = torch.randint(0, QWEN2_MOE["vocab_size"], (BATCH, SEQ))
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu, profile_memory=True) as prof, pytest.raises(StopIteration):
        real(input_ids=tokens, labels=tokens)
    handle.remove()
    live = real_peak = 0
    for _, nbytes in sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type().name == "CPU"
    ):
        live += nbytes
        real_peak = max(real_peak, live)
    # the allocator also holds the embeddings' output, which the trace leaves to the first layer
    hidden = BATCH * SEQ * QWEN2_MOE["hidden_size"] * 2
    assert real_peak - hidden <= peak <= real_peak


def _real_mlp_saved(config: dict[str, Any]) -> int:
    """The allocator's bytes left alive by one real decoder layer's MLP block's forward pass (what it keeps for
    backward), its output left out."""
    hf = AutoConfig.for_model(**config)
    hf._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16).train()
    mlp = decoder_layers(model)[0].mlp
    captured: list[torch.Tensor] = []

    def grab(module: Any, args: Any) -> None:
        captured.append(args[0].detach().requires_grad_())
        raise StopIteration

    handle = mlp.register_forward_pre_hook(grab)
    tokens = torch.randint(0, config["vocab_size"], (BATCH, SEQ))
    with pytest.raises(StopIteration):
        model(input_ids=tokens, labels=tokens)
    handle.remove()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        output = mlp(captured[0])
    live = sum(
        event.nbytes()
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]" and event.device_type().name == "CPU"
    )
    return live - output.untyped_storage().nbytes()


@pytest.mark.parametrize("config", [QWEN2, QWEN2_MOE], ids=["dense", "moe"])
def test_what_the_mlp_block_saves_is_the_allocators(config: dict[str, Any]) -> None:
    """What a tiled MLP drops, traced under fake tensors, against the allocator of the real block's forward. The
    MoE block keeps more than the formula's intermediates (measured: the routed outputs the routing weights scale,
    the shared expert's output its gate scales), which the estimate's fallback formula does not know."""
    hf = AutoConfig.for_model(**config)
    hf._attn_implementation = "sdpa"
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16).train()
        traced = layer_backward_peaks(model, 0, BATCH, SEQ)[4]
    assert traced == _real_mlp_saved(config)
    if config is QWEN2:  # a gated MLP's four intermediate-wide tensors
        assert traced == 4 * 2 * BATCH * SEQ * QWEN2["intermediate_size"]
