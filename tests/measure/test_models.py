"""Built-in models: their parameters are exactly the spec's, in the spec's order, and they train."""

import pytest

torch = pytest.importorskip("torch")

from tuner.measure.rank.models import build_model, synthetic_batch  # noqa: E402
from tuner.workload import load_builtin_model, model_from_hf_config  # noqa: E402


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "gpt2", "qwen2-1.5b"])
def test_parameters_match_spec(name: str) -> None:
    spec = load_builtin_model(name)
    with torch.device("meta"):
        model = build_model(spec)
    assert [p.numel() for p in model.parameters()] == list(spec.param_numels)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_sdpa_and_eager_agree_and_learn(attention: str, checkpointing: bool) -> None:
    spec = load_builtin_model("tiny-llama")
    torch.manual_seed(0)
    model = build_model(spec, attention=attention, checkpointing=checkpointing)
    tokens, targets = synthetic_batch(spec, 2, 16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = model(tokens, targets)
    for _ in range(5):
        loss = model(tokens, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < first.item()


def test_attention_kinds_compute_the_same_function() -> None:
    spec = model_from_hf_config(
        {"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 32}
    )
    torch.manual_seed(0)
    sdpa = build_model(spec, attention="sdpa")
    eager = build_model(spec, attention="eager")
    eager.load_state_dict(sdpa.state_dict())
    tokens, targets = synthetic_batch(spec, 2, 8)
    assert torch.allclose(sdpa(tokens, targets), eager(tokens, targets), atol=1e-5)
