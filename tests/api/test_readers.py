"""What a reader without the token sees (tuner.api.readers): no launch variables, no command lines, no server paths;
with the token, the records whole; with a wrong one, 403."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tuner.api import create_app
from tuner.api.readers import public_error
from tuner.estimator import estimate
from tuner.storage import Store
from tuner.workload import ClusterSpec, LaunchEnv, TrialConfig, Workload, model_from_param_count

TOKEN = "reader-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WRONG = {"Authorization": "Bearer nope"}
VARIABLES = {"NCCL_SOCKET_IFNAME": "team_private_ifname", "OMP_NUM_THREADS": "2"}
RAY_OOM = (
    "Task was killed due to the node running low on memory.\nTop 10 memory users:\nPID\tMEM(GB)\tCOMMAND\n"
    "4242\t7.70\t/usr/bin/python -m other_user.train --api-key abc /home/other/secret.yaml"
)
TRACEBACK = (
    'Traceback (most recent call last):\n  File "/srv/dstune/tuner/measure/run.py", line 3, in run\n'
    "subprocess.CalledProcessError: Command '['/usr/bin/python', '-m', 'x', '--token', 'abc']' returned 1"
)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(f"sqlite:///{tmp_path}/api.db", TOKEN)) as test_client:
        yield test_client


def _seed(store: Store, space: str) -> None:
    cluster = ClusterSpec(gpus_per_node=2, device="cpu")
    workload = Workload(model_from_param_count(1e8), cluster, launch=LaunchEnv.of(variables=VARIABLES))
    settings = {"space": space, "nvme_path": "/local/nvme/team", "pins": {}}
    study = store.get_or_create_study("s1", store.upsert_workload(workload), "tpe", settings)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}
    trial_id = store.add_trial(study.id, 0, "k0", config, {}, False, estimate(workload, TrialConfig(config)))
    store.start_trial(trial_id)
    store.finish_trial(trial_id, "error", {"peak_bytes_per_rank": [1, 1]}, error=TRACEBACK)


def test_a_reader_without_the_token_sees_no_variables_no_command_lines_no_paths(client: TestClient) -> None:
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    work = {"model": "tiny-gpt2", "model_impl": "builtin", "device": "cpu", "seq_len": 256}
    body = {"workload": {**work, "launch": {"variables": VARIABLES}}}
    created = client.post("/v1/jobs", json=body, headers=AUTH)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    store.finish_job(job_id, "failed", RAY_OOM)
    _seed(store, "/srv/dstune/spaces/default.yaml")
    anonymous = [
        client.get("/v1/jobs"),
        client.get(f"/v1/jobs/{job_id}"),
        client.get("/v1/studies"),
        client.get("/v1/studies/s1"),
        client.get("/v1/studies/s1/trials"),
    ]
    for response in anonymous:
        assert response.status_code == 200, response.text
        for hidden in ("team_private_ifname", "OMP_NUM_THREADS", "/usr/bin", "/home/other", "/srv/", "/local/nvme"):
            assert hidden not in response.text, (response.request.url, hidden)
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["error"] == "Task was killed due to the node running low on memory."
    assert job["request"]["workload"]["launch"] == {"launcher": "deepspeed", "bind_cores": False}
    assert client.get("/v1/studies").json()[0]["settings"]["space"] == "default.yaml"
    assert client.get("/v1/studies/s1/trials").json()["items"][0]["error"].startswith("subprocess.CalledProcessError")
    full = client.get(f"/v1/jobs/{job_id}", headers=AUTH).json()
    assert full["request"]["workload"]["launch"]["variables"] == VARIABLES and full["error"] == RAY_OOM
    assert "team_private_ifname" in client.get("/v1/studies/s1", headers=AUTH).text
    for path in ("/v1/jobs", f"/v1/jobs/{job_id}", "/v1/studies", "/v1/studies/s1", "/v1/studies/s1/trials"):
        assert client.get(path, headers=WRONG).status_code == 403


def test_a_public_error_is_one_line_without_argv_or_paths() -> None:
    shown = public_error(TRACEBACK)
    assert shown == "subprocess.CalledProcessError: Command '[<command>]' returned 1"
    assert public_error("rank 1: 3.2 GB at 512 tokens/s, see /tmp/dstune-run-x/rank-1.log") == (
        "rank 1: 3.2 GB at 512 tokens/s, see <path>"
    )
    assert public_error(None) is None


SCRIPT_ARGV = ["deepspeed", "/home/alice/train.py", "--hub_token", "hf_secretsecretsecret", "--deepspeed", "ds.json"]


def _seed_script_study(store: Store) -> None:
    """A study of a training command, as ``dstune tune -- <command>`` records it."""
    cluster = ClusterSpec(gpus_per_node=2, device="cpu")
    workload = Workload(model_from_param_count(1e8), cluster)
    settings = {"space": "default.yaml", "pins": {}, "script": {"argv": SCRIPT_ARGV, "cwd": "/home/alice/proj"}}
    study = store.get_or_create_study("s2", store.upsert_workload(workload), "tpe", settings)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "train_batch_size": 2}
    trial_id = store.add_trial(study.id, 0, "k0", config, {}, False, estimate(workload, TrialConfig(config)))
    store.start_trial(trial_id)
    slot = {"index": 5, "key": None, "source": "--deepspeed", "hf": False}
    script = {"backend": "script", "command": " ".join(SCRIPT_ARGV), "argv": SCRIPT_ARGV, "slot": slot}
    measured = {"peak_bytes_per_rank": [1, 1], "tokens_per_s": 100.0, "script": {**script, "ds_config": config}}
    store.finish_trial(trial_id, "ok", measured)


def test_a_script_studys_command_is_shown_to_no_reader_without_the_token(client: TestClient) -> None:
    """The command can hold paths and a token passed as a flag: not in the open API, pages or recommend notes."""
    from tuner.recommend import recommend

    store: Store = client.app.state.store  # type: ignore[attr-defined]
    _seed_script_study(store)
    open_pages = [
        client.get("/v1/studies"),
        client.get("/v1/studies/s2"),
        client.get("/v1/studies/s2/trials"),
        client.get("/studies/s2"),
        client.get("/studies/s2/trials/0"),
    ]
    for response in open_pages:
        assert response.status_code == 200, (response.request.url, response.text)
        for hidden in ("hf_secretsecretsecret", "/home/alice"):
            assert hidden not in response.text, (response.request.url, hidden)
    assert "dstune best --study" in client.get("/studies/s2").text
    study = store.get_study("s2")
    assert study is not None
    notes = recommend(store, store.workload_of(study.id)).to_dict()["notes"]
    assert any("dstune best --study" in note for note in notes), notes
    assert not [note for note in notes if "hf_secret" in note or "/home/alice" in note], notes
    assert "hf_secretsecretsecret" in client.get("/v1/studies/s2", headers=AUTH).text
