"""A newcomer's first tries, as typed: ``dstune tune`` with its defaults (no ``--gpu-memory``, no ``--global-batch``)
for each model family and a MoE ``config.json``, each sampler, ``--pareto``, both launchers, two Ray nodes, a resumed
study, ``--device cuda`` without a GPU, and ``best`` / ``serve`` / ``worker`` taking the database from
``DSTUNE_STORAGE``. (A tight ``--gpu-memory`` budget is the README's own command, which CI runs first.) Real runs (real
DeepSpeed on CPU ranks), 1-3 trials each; every one ends with its documented exit code and no traceback anywhere in
what it printed.

Only the measuring flags are shortened (``--warmup 1 --steps 1``): they decide how long a run is timed, not which
configs the study proposes, which is what broke first tries before (a warm start enqueuing ``None``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("deepspeed")

from tuner.storage import Store  # noqa: E402
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model  # noqa: E402

pytestmark = pytest.mark.deepspeed
DSTUNE = str(Path(sys.executable).with_name("dstune"))
SHORT = ["--warmup", "1", "--steps", "1", "--device", "cpu", "--seq-len", "32"]
TINY_MOE = {
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "max_position_embeddings": 128,
}


def dstune(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """Run ``dstune ARGS`` as a user does, in ``cwd``; fail the test on any traceback in its output."""
    result = subprocess.run(
        [DSTUNE, *args], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-4000:]
    return result


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout


def recorded(db: Path, study: str) -> list:
    with Store.open(f"sqlite:///{db}") as store:
        record = store.get_study(study)
        assert record is not None, f"no study {study} in {db}"
        return store.trials(record.id)


def distinct_configs(trials: list) -> int:
    return len({t.config_key for t in trials})


@dataclass(frozen=True)
class FirstStudy:
    """What the plainest first try printed and recorded, and the folder it ran in (where its study lives on)."""

    folder: Path
    printed: str
    study: str
    trials: list


# The plainest study of the issue (it crashed on its first trial): defaults, 2 ranks, the local launcher. Run again
# with a larger budget, the same command resumes the same study (its default name is the model and a fingerprint).
PLAINEST = ["tune", "--model", "tiny-gpt2", "--gpus", "2", *SHORT, "--launcher", "local"]


@pytest.fixture(scope="module")
def plainest_first_try(tmp_path_factory: pytest.TempPathFactory) -> FirstStudy:
    """The plainest first try, run once for this module: its own test reads what it printed and recorded; the
    resume test then resumes that very study (one 2-rank study fewer than running it twice)."""
    folder = tmp_path_factory.mktemp("plainest")
    printed = ok(dstune(*PLAINEST, "--trials", "2", cwd=folder))
    with Store.open(f"sqlite:///{folder / 'dstune.db'}") as store:
        (study,) = store.list_studies()
    return FirstStudy(folder, printed, study.name, recorded(folder / "dstune.db", study.name))


def test_the_plainest_first_try_with_defaults_finishes(plainest_first_try: FirstStudy) -> None:
    assert "top configs" in plainest_first_try.printed
    trials = plainest_first_try.trials
    assert distinct_configs(trials) == 2 and {t.status for t in trials} <= {"ok", "pruned", "oom"}


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("tiny-llama", ["--gpus", "1", "--sampler", "random"]),
        ("moe", ["--gpus", "2", "--sampler", "grid"]),
        ("tiny-gpt2", ["--gpus", "1", "--sampler", "gp", "--pareto"]),
    ],
    ids=["llama-random", "moe-grid", "gp-pareto"],
)
def test_first_tries_with_defaults_finish(tmp_path: Path, model: str, extra: list[str]) -> None:
    if model == "moe":
        (tmp_path / "config.json").write_text(json.dumps(TINY_MOE))
        model = str(tmp_path / "config.json")
    out = ok(dstune("tune", "--model", model, *SHORT, *extra, "--trials", "2", "--launcher", "local", cwd=tmp_path))
    assert "top configs" in out
    with Store.open(f"sqlite:///{tmp_path / 'dstune.db'}") as store:
        (study,) = store.list_studies()
    trials = recorded(tmp_path / "dstune.db", study.name)
    assert distinct_configs(trials) == 2 and {t.status for t in trials} <= {"ok", "pruned", "oom"}


def test_a_resumed_study_with_more_trials_and_best_from_the_environment(
    plainest_first_try: FirstStudy, tmp_path: Path
) -> None:
    """The plainest first try (2 trials), typed again with ``--trials 3``: the same study resumes to 3 configs."""
    folder, study = plainest_first_try.folder, plainest_first_try.study
    ok(dstune(*PLAINEST, "--trials", "3", cwd=folder))
    trials = recorded(folder / "dstune.db", study)
    assert distinct_configs([t for t in trials if t.status != "failed"]) == 3
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    storage = {"DSTUNE_STORAGE": f"sqlite:///{folder / 'dstune.db'}"}
    exported = json.loads(ok(dstune("best", "--study", study, cwd=elsewhere, env=storage)))
    assert exported["train_batch_size"] >= 2
    assert ok(dstune("worker", "--once", cwd=elsewhere, env=storage)) is not None
    assert not (elsewhere / "dstune.db").exists()


def test_tune_through_a_local_ray_writes_where_dstune_storage_says(tmp_path: Path) -> None:
    db = tmp_path / "team.db"
    ok(
        dstune(
            "tune", "--model", "tiny-gpt2", "--gpus", "1", *SHORT, "--trials", "1", "--study", "via-ray",
            cwd=tmp_path, env={"DSTUNE_STORAGE": f"sqlite:///{db}"},
        )
    )  # fmt: skip
    assert [t.status for t in recorded(db, "via-ray")] == ["ok"]
    assert not (tmp_path / "dstune.db").exists()


@pytest.fixture
def two_ray_nodes() -> Iterator[str]:
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster.address
    cluster.shutdown()


def test_two_nodes_on_a_local_ray_cluster(tmp_path: Path, two_ray_nodes: str) -> None:
    out = ok(
        dstune(
            "tune", "--model", "tiny-gpt2", "--gpus", "1", "--nodes", "2", *SHORT, "--trials", "1",
            "--ray-address", two_ray_nodes, cwd=tmp_path,
        )
    )  # fmt: skip
    assert "top configs" in out


def test_device_cuda_without_a_gpu_is_refused_in_seconds(tmp_path: Path) -> None:
    start = time.monotonic()
    result = dstune(
        "tune", "--model", "tiny-gpt2", "--gpus", "1", "--device", "cuda", "--launcher", "local", cwd=tmp_path
    )
    took = time.monotonic() - start
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: device: "), result.stderr
    assert took < 60, f"{took:.0f} s to refuse"  # 139 s before; imports alone take ~10 s on a loaded machine


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_takes_the_database_from_the_environment(tmp_path: Path) -> None:
    db = tmp_path / "team.db"
    with Store.open(f"sqlite:///{db}") as store:
        work = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(32))
        store.get_or_create_study("served", store.upsert_workload(work), "tpe", {})
    port = _free_port()
    server = subprocess.Popen(
        [DSTUNE, "serve", "--insecure-no-auth", "--port", str(port)],
        cwd=tmp_path / "..",
        env={**os.environ, "DSTUNE_STORAGE": f"sqlite:///{db}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/studies", timeout=5) as response:
                    studies = json.loads(response.read())
                break
            except OSError:
                assert time.monotonic() < deadline, "serve never answered"
                time.sleep(0.5)
        names = [study["name"] for study in studies]
        assert names == ["served"]
    finally:
        server.terminate()
        server.wait(timeout=30)
