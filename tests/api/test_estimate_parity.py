"""``POST /v1/estimate`` and ``dstune estimate --json`` answer the same bytes for the same input, for every trial
field the CLI's flags set: the numerics choices (bf16 master weights and optimizer states, Muon, the chunked loss,
Liger), Ulysses, and a ds_config whose ``torch_autocast`` changes the activations traced (one shared path,
:func:`tuner.requests.trial_workload`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from tuner.api import create_app
from tuner.cli.app import app as cli_app

WORKLOAD = {"model": "tiny-llama", "gpus": 2, "device": "cpu", "seq_len": 256}
FLAGS = ["--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--seq-len", "256"]
AUTOCAST = {"torch_autocast": {"enabled": True, "dtype": "torch.bfloat16"}}
CASES: list[tuple[dict[str, Any], list[str]]] = [
    (
        {"stage": 3, "bf16_master_weights": True, "bf16_optimizer_states": True},
        ["--stage", "3", "--bf16-master-weights", "--bf16-optimizer-states"],
    ),
    (
        {"stage": 1, "optimizer": "muon", "chunked_loss": True},
        ["--stage", "1", "--optimizer", "muon", "--chunked-loss"],
    ),
    ({"stage": 2, "liger": True, "device": "cuda"}, ["--stage", "2", "--liger", "--device", "cuda"]),
    ({"stage": 2, "sequence_parallel": 2}, ["--stage", "2", "--sequence-parallel", "2"]),
    ({"stage": 2, "ds_config": AUTOCAST}, ["--stage", "2", "--ds-config", "AUTOCAST"]),
    ({"stage": 3, "activation_checkpointing": True}, ["--stage", "3", "--activation-checkpointing"]),
    ({"stage": 2, "ds_config": {**AUTOCAST, "bf16": {"enabled": False}}}, ["--stage", "2", "--ds-config", "FP32"]),
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("parity") / "dstune.db"
    with TestClient(create_app(f"sqlite:///{db}", None, recommend_cache_s=0, request_budget_s=600)) as test_client:
        yield test_client


@pytest.mark.parametrize(
    ("fields", "flags"),
    CASES,
    ids=["bf16-master", "muon-chunked", "liger", "ulysses", "autocast", "checkpointing", "autocast-fp32"],
)
def test_the_api_estimate_is_the_clis(
    client: TestClient, tmp_path: Path, fields: dict[str, Any], flags: list[str]
) -> None:
    if "--ds-config" in flags:
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(fields["ds_config"]))
        flags = [str(path) if flag in ("AUTOCAST", "FP32") else flag for flag in flags]
    fields = dict(fields)
    done = CliRunner().invoke(cli_app, ["estimate", *FLAGS, *flags, "--json"])
    assert done.exit_code == 0, done.output
    cli = json.loads(done.stdout)
    # the workload object's fields: the device (Liger's kernels: CUDA only) and checkpointing
    moved = {key: fields.pop(key) for key in ("device", "activation_checkpointing") if key in fields}
    response = client.post("/v1/estimate", json={"workload": {**WORKLOAD, **moved}, **fields})
    assert response.status_code == 200, response.text
    api = response.json()
    for key, value in cli.items():
        assert api[key] == value, key


def test_a_torch_autocast_dtype_deepspeed_refuses_is_422_at_its_key(client: TestClient) -> None:
    body = {"workload": WORKLOAD, "ds_config": {"torch_autocast": {"enabled": True, "dtype": "int8"}}}
    response = client.post("/v1/estimate", json=body)
    assert response.status_code == 422, response.text
    locs = [error["loc"] for error in response.json()["detail"]]
    assert ["body", "ds_config", "torch_autocast", "dtype"] in locs, locs


# seq_len "max": the longest sequence, on the API and from ``dstune estimate --max-seq-len`` (the pins' sections of
# one function, tuner.requests.search_pins; the activations traced by tuner.requests.trial_workload on both faces)
TINY = {"model": "tiny-llama", "gpus": 2, "device": "cpu"}
TINY_FLAGS = ["--model", "tiny-llama", "--gpus", "2", "--device", "cpu"]
LLAMA = {"model": "llama-2-7b", "gpus": 8}
LLAMA_FLAGS = ["--model", "llama-2-7b", "--gpus", "8"]
MAX_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], list[str]]] = {
    # each: the workload object, the body's trial fields, the CLI's flags
    "autocast": ({**TINY, "precision": "fp32"}, {"ds_config": AUTOCAST}, [*TINY_FLAGS, "--precision", "fp32"]),
    "liger": ({**TINY, "device": "cuda"}, {"liger": True}, [*TINY_FLAGS[:-2], "--device", "cuda", "--liger"]),
    "muon": (
        TINY,
        {"stage": 1, "optimizer": "muon", "bf16_master_weights": True, "bf16_optimizer_states": True},
        [*TINY_FLAGS, "--stage", "1", "--optimizer", "muon", "--bf16-master-weights", "--bf16-optimizer-states"],
    ),
    "chunked-loss": ({**TINY, "precision": "bf16"}, {"chunked_loss": True}, [*TINY_FLAGS, "--chunked-loss"]),
    "autotp": (LLAMA, {"tensor_parallel": 2}, [*LLAMA_FLAGS, "--tensor-parallel", "2"]),
    "fp32": ({**TINY, "precision": "fp32"}, {}, [*TINY_FLAGS, "--precision", "fp32"]),
    "ulysses": (TINY, {"sequence_parallel": 2}, [*TINY_FLAGS, "--sequence-parallel", "2"]),
    "no-checkpointing": (
        {**TINY, "activation_checkpointing": False},
        {},
        [*TINY_FLAGS, "--no-activation-checkpointing"],
    ),
    "gpu-type": (
        {**LLAMA, "gpu_type": "h100-80gb"},
        {"stage": 3},
        [*LLAMA_FLAGS, "--gpu-type", "h100-80gb", "--stage", "3"],
    ),
}


@pytest.mark.parametrize("case", list(MAX_CASES))
def test_the_api_longest_sequence_is_the_clis(client: TestClient, tmp_path: Path, case: str) -> None:
    work, fields, flags = MAX_CASES[case]
    if "ds_config" in fields:
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(fields["ds_config"]))
        flags = [*flags, "--ds-config", str(path)]
    done = CliRunner().invoke(cli_app, ["estimate", *flags, "--max-seq-len", "--json"])
    assert done.exit_code == 0, done.output
    cli = json.loads(done.stdout)
    response = client.post("/v1/estimate", json={"workload": {**work, "seq_len": "max"}, **fields})
    assert response.status_code == 200, response.text
    api = response.json()
    assert api["max_seq_len"] == cli["max_seq_len"]
    for key, value in cli.items():
        if key != "export":  # the CLI's config to train with, beside the answer
            assert api[key] == value, key


@pytest.mark.parametrize(("work", "flags"), [(TINY, TINY_FLAGS), (LLAMA, LLAMA_FLAGS)], ids=["tiny-llama", "llama"])
def test_the_recommended_longest_sequence_is_the_clis_at_the_default_margin(
    client: TestClient, work: dict[str, Any], flags: list[str]
) -> None:
    done = CliRunner().invoke(cli_app, ["estimate", *flags, "--max-seq-len", "--margin", "5%", "--json"])
    assert done.exit_code == 0, done.output
    cli = json.loads(done.stdout)
    response = client.post("/v1/recommend", json={"workload": {**work, "seq_len": "max"}})
    assert response.status_code == 200, response.text
    assert response.json()["max_seq_len"] == cli["max_seq_len"]


BAD_MAX: dict[str, tuple[dict[str, Any], dict[str, Any], list[str], list[str], str]] = {
    # each: the workload object's fields, the body's, the flags, the API's loc, what the CLI's line starts with
    "optimizer": ({}, {"optimizer": "sgd"}, ["--optimizer", "sgd"], ["body", "optimizer"], "error: optimizer:"),
    "autotp": (
        {},
        {"tensor_parallel": 0},
        ["--tensor-parallel", "0"],
        ["body", "tensor_parallel"],
        "error: tensor-parallel:",
    ),
    "gpu-type": (
        {"gpu_type": "H100"},
        {},
        ["--gpu-type", "H100"],
        ["body", "workload", "gpu_type"],
        "error: gpu-type:",
    ),
    "liger-on-cpu": (
        {},
        {"liger": True},
        ["--liger"],
        ["body", "ds_config", "dstune", "liger_kernel"],
        "error: dstune.liger_kernel:",
    ),
}


@pytest.mark.parametrize("case", list(BAD_MAX))
def test_a_bad_field_of_a_longest_sequence_question_is_named_alike(client: TestClient, case: str) -> None:
    work, fields, flags, loc, line = BAD_MAX[case]
    done = CliRunner().invoke(cli_app, ["estimate", *TINY_FLAGS, *flags, "--max-seq-len", "--json"])
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith(line) and "Traceback" not in done.output, done.output
    response = client.post("/v1/estimate", json={"workload": {**TINY, **work, "seq_len": "max"}, **fields})
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]], response.text
