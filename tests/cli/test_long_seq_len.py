"""``--seq-len`` (and the request's ``seq_len``) as long as the estimator answers: ``--max-seq-len``'s own range
(:data:`tuner.workload.MAX_SEQ_LEN`, the search's cap). ALST's published multi-million-token runs can be asked about;
it used to stop at 1,048,576."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.cli.test_cli import assert_usage_error
from tuner.cli.app import app
from tuner.forecast import SEARCH_CAP
from tuner.requests import WorkloadRequest, to_workload
from tuner.workload import MAX_SEQ_LEN

runner = CliRunner()
# ALST's 3.7M tokens on 8 H100s (Llama-8B: ZeRO-3, offloads, Ulysses 8, tiled MLP and loss, checkpoints on the host)
ALST_8 = [
    "--model", "llama-3-8b", "--model-impl", "builtin", "--gpus", "8", "--gpu-type", "h100-80gb", "--stage", "3",
    "--offload-optimizer", "cpu", "--offload-param", "cpu", "--activation-checkpointing", "--sequence-parallel", "8",
    "--tiled-mlp", "113", "--tiled-loss", "1024", "--offload-checkpoints", "--cpu-memory", "2TiB",
]  # fmt: skip


def test_multi_million_token_lengths_are_estimated() -> None:
    result = runner.invoke(app, ["estimate", *ALST_8, "--seq-len", "3700000", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["fits"]


def test_the_bound_is_the_searchs_own() -> None:
    assert MAX_SEQ_LEN == SEARCH_CAP == 2**26
    assert to_workload(WorkloadRequest(params=1e9, seq_len=MAX_SEQ_LEN)).train.seq_len == MAX_SEQ_LEN
    too_long = runner.invoke(app, ["estimate", *ALST_8, "--seq-len", str(MAX_SEQ_LEN + 1), "--json"])
    assert_usage_error(too_long, "seq-len")
