"""What a training command's model runs, read as the script rank hook reads it after the timed steps
(tuner.measure.script.code_paths): a real transformers model with DeepSpeed's own ``install_chunked_causal_lm_loss``
on it, the same model without it, a plain ``nn.Module``. Liger-Kernel needs Triton and is not installed here: its
modules and functions are stood in by objects that carry its module names, the only thing the reader looks at."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("deepspeed")

from tuner.measure.script.code_paths import code_paths  # noqa: E402

CONFIG = {"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}


def llama() -> object:
    config = transformers.LlamaConfig(**CONFIG, num_attention_heads=4, num_key_value_heads=2)
    return transformers.LlamaForCausalLM(config)


def test_deepspeeds_chunked_loss_installed_on_the_model_is_seen() -> None:
    from deepspeed.runtime.chunked_cross_entropy import install_chunked_causal_lm_loss

    model = llama()
    assert code_paths(model) == {"chunked_loss": False, "liger": False}
    install_chunked_causal_lm_loss(model)
    assert code_paths(model) == {"chunked_loss": True, "liger": False}
    wrapped = torch.nn.Sequential(model)  # a script's own wrapper around the transformers model
    assert code_paths(wrapped)["chunked_loss"] is True


def test_a_plain_module_with_its_own_loss_runs_neither() -> None:
    model = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    assert code_paths(model) == {"chunked_loss": False, "liger": False}


def test_liger_modules_and_forwards_are_seen_by_their_module_names() -> None:
    class LigerRMSNorm(torch.nn.Module):  # as liger_kernel.transformers.rms_norm defines it
        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return hidden

    LigerRMSNorm.__module__ = LigerRMSNorm.forward.__module__ = "liger_kernel.transformers.rms_norm"
    model = llama()
    model.model.norm = LigerRMSNorm()  # built after apply_liger_kernel_to_llama() replaced the class
    assert code_paths(model) == {"chunked_loss": False, "liger": True}
    patched = llama()  # apply_liger_kernel_to_llama(model=...) on a built model: monkey_patch._bind_method_to_module
    norm = patched.model.norm
    norm.__dict__["forward"] = LigerRMSNorm.forward.__get__(norm, norm.__class__)
    assert code_paths(patched)["liger"] is True

    def lce_forward(self: object, *args: object, **kwargs: object) -> None:
        return None

    lce_forward.__module__ = "liger_kernel.transformers.model.llama"
    bound = llama()
    bound.forward = types.MethodType(lce_forward, bound)  # an instance patched with Liger's fused loss forward
    assert code_paths(bound)["liger"] is True
