"""What a training command's run reads back when dstune knows nothing of its model (no ``--model``): samples/s
always, tokens/s only where the tokens per sample are known (the token ids its forward saw, or ``--seq-len``), and
no model FLOPs nor estimate (pure logic over the files its ranks write)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.measure.measurement import RankResult
from tuner.measure.script.estimate_note import script_estimate
from tuner.measure.script.readback import read_back
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, unknown_model

STEPS = [0.5, 0.5, 0.5]


def own_model(seq_len: int = 2048) -> Workload:
    return Workload(unknown_model("3f2a9c1d"), ClusterSpec(gpus_per_node=2, device="cpu"), TrainSpec(seq_len))


def write_ranks(run_dir: Path, tokens_per_sample: int) -> None:
    """Two ranks that trained 8 samples per step (micro 2 × accumulation 2 × 2 ranks), each seeing 4 samples of
    ``tokens_per_sample`` token ids (0: its forward took no token ids) in the timed steps."""
    for rank in range(2):
        seen = {"micro_batches": 2, "samples": 4, "tokens": 4 * tokens_per_sample, "longest": tokens_per_sample}
        result = RankResult(rank, "ok", step_times=list(STEPS), peak_allocated=2**20)
        result.script = {"seen": seen, "train_batch_size": 8, "world_size": 2, "micro_batch": 2}
        (run_dir / f"rank-{rank}.json").write_text(json.dumps(result.to_dict()))


@pytest.mark.parametrize(
    ("tokens_per_sample", "seq_len_known", "tokens_per_s", "tokens_from"),
    [
        (0, False, None, "unknown"),  # no token ids, no --seq-len: samples/s only
        (0, True, 8 * 128 / 0.5, "--seq-len"),  # --seq-len 128 given
        (96, False, 8 * 96 / 0.5, "the token ids"),  # read from the run
    ],
)
def test_tokens_per_second_only_where_the_length_is_known(
    tmp_path: Path, tokens_per_sample: int, seq_len_known: bool, tokens_per_s: float | None, tokens_from: str
) -> None:
    write_ranks(tmp_path, tokens_per_sample)
    measured = read_back(tmp_path, own_model(128), None, 0, 60.0, seq_len_known)
    assert measured.status == "ok"
    assert measured.samples_per_s == pytest.approx(8 / 0.5)
    assert measured.tokens_per_s == (None if tokens_per_s is None else pytest.approx(tokens_per_s))
    assert measured.script["tokens_from"].startswith(tokens_from)
    assert measured.tflops_per_device is None and measured.mfu is None  # no model, no model FLOPs


def test_no_estimate_is_made_of_a_model_nobody_described() -> None:
    trial = TrialConfig({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}})
    estimate, why = script_estimate(own_model(), trial)
    assert estimate is None and "no --model" in why
