"""AutoEP measured through ``dstune measure``: a tiny Qwen2-MoE (4 experts top-2, every layer MoE, fp32) trained with
``--expert-parallel 2`` on 2 gloo CPU ranks against one rank holding both samples (the same seeded global batch of
2). The Qwen2-MoE preset needs the runner's registry shim with transformers 5.24
(:mod:`tuner.measure.rank.layouts.autoep`), and the runner must let DeepSpeed find the MoE blocks inside its wrapper:
without either, the run fails or trains with every expert on every rank, which the per-rank parameter count tells
apart."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("deepspeed")

from tiny_configs import TINY_CONFIGS
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.study.numerics_guard import compare

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]
QWEN2_MOE = {**TINY_CONFIGS["qwen2_moe"], "num_hidden_layers": 2, "mlp_only_layers": [], "tie_word_embeddings": False}
EXACT = 1e-5  # fp32: the same sums in another order (measured 7.6e-8, bench/results/autoep_check.md)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One rank with micro-batch 2 and AutoEP 2 on 2 ranks with micro-batch 1, ZeRO-2, one step each."""
    path = tmp_path_factory.mktemp("moe") / "config.json"
    path.write_text(json.dumps(QWEN2_MOE))
    common = ["measure", "--model", str(path), "--device", "cpu", "--precision", "fp32", "--seq-len", "32"]
    common += ["--stage", "2", "--warmup", "0", "--steps", "1", "--timeout", "900", "--json"]
    found = {}
    for name, extra in {
        "one": ["--gpus", "1", "--micro-batch", "2"],
        "ep": ["--gpus", "2", "--micro-batch", "1", "--expert-parallel", "2"],
    }.items():
        result = CliRunner().invoke(app, [*common, *extra])
        assert result.exit_code == 0, result.output[-3000:]
        found[name] = json.loads(result.stdout)
    return found


def test_ep_step0_loss_and_grad_norm_equal_one_ranks(runs: dict) -> None:
    one, ep = runs["one"]["numerics"], runs["ep"]["numerics"]
    assert one["step0_loss"] > 0 and one["step0_grad_norm"] > 0
    assert ep["step0_loss"] == pytest.approx(one["step0_loss"], rel=EXACT)
    assert ep["step0_grad_norm"] == pytest.approx(one["step0_grad_norm"], rel=EXACT)
    assert not compare(ep, one, "fp32").diverged  # the study's numerics guard agrees


def test_each_rank_holds_half_the_experts(runs: dict) -> None:
    held = [rank["local_params"] for rank in runs["ep"]["ranks"]]
    assert runs["one"]["ranks"][0]["local_params"] == 189_632
    assert held == [152_768, 152_768]  # 2 of 4 experts in each MoE layer (bench/results/autoep_check.md)
    assert [rank["layout"]["ep_rank"] for rank in runs["ep"]["ranks"]] == [0, 1]
