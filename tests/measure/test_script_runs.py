"""The user's own training command measured and tuned unchanged, on 2 CPU ranks: the example scripts users read
(``examples/scripts``: a raw ``deepspeed.initialize`` loop, an HF Trainer script, an accelerate loop), a script that
crashes, one that hangs, and a config over a memory cap. Each run is made once (module fixtures) and read by the
tests that need it."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tuner.units import format_bytes

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")

pytestmark = pytest.mark.deepspeed
BIN = Path(sys.executable).parent
DSTUNE = str(BIN / "dstune")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scripts"
CPU2 = ["--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--seq-len", "64"]
OWN_MODEL = ["--gpus", "2", "--device", "cpu"]  # no --model nor --seq-len: the script's own model, nothing estimated
RAW = [str(BIN / "deepspeed"), "--num_gpus", "2", "raw_deepspeed.py", "--deepspeed", "--deepspeed_config"]


def dstune(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DSTUNE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the example scripts (a run writes nothing beside them, but the tests add their own)."""
    folder = tmp_path_factory.mktemp("scripts")
    for path in EXAMPLES.iterdir():
        shutil.copy(path, folder / path.name)
    return folder


@pytest.fixture(scope="module")
def raw_study(scripts: Path) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str], str]:
    """A 2-trial study of the raw DeepSpeed loop with its own ``nn.Module`` and no ``--model`` (its winner confirmed
    by a third run), and ``dstune best`` of it."""
    db = f"sqlite:///{scripts / 'raw.db'}"
    pins = ["--pin", "offload_optimizer=none", "--pin", "offload_param=none"]
    tune = dstune(
        "tune",
        *OWN_MODEL,
        "--global-batch",
        "8",
        "--trials",
        "2",
        "--launcher",
        "local",
        "--storage",
        db,
        "--study",
        "raw",
        *pins,
        "--",
        *RAW,
        "ds_config.json",
        cwd=scripts,
    )
    best = dstune("best", "--study", "raw", "--storage", db, "--out", "best.json", cwd=scripts)
    return tune, best, db


def measure(scripts: Path, *args: str) -> dict:
    done = dstune("measure", *CPU2, "--json", *args, cwd=scripts)
    assert done.stdout, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_raw_deepspeed_loop_tunes_with_memory_and_throughput_for_every_trial(raw_study, scripts: Path) -> None:
    tune, best, db = raw_study
    assert tune.returncode == 0, tune.stdout + tune.stderr
    from tuner.storage import Store

    store = Store.open(db)
    study = store.get_study("raw")
    assert study is not None
    trials = store.trials(study.id)
    measured = [t for t in trials if t.status == "ok"]
    assert measured, [(t.status, t.error) for t in trials]
    # without --model: said once, recorded on the study, nothing estimated (tokens per sample read from the run)
    assert tune.stderr.count("no --model: dstune cannot estimate") == 1, tune.stderr
    assert "no config pruned before it ran" in study.settings["no_model"]
    assert store.workload_of(study.id).model.is_unknown and all(t.estimate is None for t in trials)
    lines = [line for line in tune.stdout.splitlines() if line.startswith("trial ")]  # a pipe: a line per trial
    for trial in measured:
        figures = trial.measurement or {}
        assert figures["script"]["backend"] == "script"
        if not figures.get("stopped_early"):
            assert all(peak and peak > 0 for peak in figures["peak_bytes_per_rank"])
            assert figures["tokens_per_s"] > 0 and figures["script"]["tokens_from"].startswith("the token ids")
            said = (
                f"trial {trial.number}: ok, {trial.tokens_per_s:,.0f} tokens/s, peak {format_bytes(trial.peak_bytes)}"
            )
            assert any(line.startswith(said) for line in lines), lines
    # the winner confirmed by an independent run of the same command (tune's default for a command), recorded
    # beside the trial and printed by tune and best
    winner = store.best_trial(study.id)
    assert winner is not None
    confirmation = (winner.measurement or {})["confirmation"]
    assert confirmation["status"] == "ok" and confirmation["tokens_per_s"] > 0, confirmation
    # timed on more steps than the trial (a script that ends first, its 50 steps, is measured on those it timed),
    # the speeds compared by the medians of the two runs' step times
    assert confirmation["steps"] > confirmation["trial_steps"] == 3, confirmation
    assert confirmation["ratio"] == confirmation["trial_step_time_p50_s"] / confirmation["step_time_p50_s"]
    assert "by an independent run" in tune.stdout or "independent run measured" in tune.stdout, tune.stdout
    assert "independent run" in best.stderr, best.stderr
    # best: the user's optimizer and scheduler kept, the command filled in
    config = json.loads((scripts / "best.json").read_text())
    assert config["scheduler"]["type"] == "WarmupLR" and config["optimizer"]["params"]["torch_adam"] is True
    assert "--deepspeed_config best.json" in best.stderr, best.stderr
    assert "figures are your training command's" in best.stderr
    assert "your command's model ran neither DeepSpeed's chunked cross-entropy loss nor Liger" in best.stderr


@contextlib.contextmanager
def default_port_taken() -> Iterator[None]:
    """torch's default rendezvous port 29500 held by another process (or already held: the same for the test)."""
    with socket.socket() as holder:
        with contextlib.suppress(OSError):
            holder.bind(("127.0.0.1", 29500))
            holder.listen()
        yield


def test_an_hf_trainer_script_is_measured_with_its_batch_flags(scripts: Path) -> None:
    with default_port_taken():  # another job on the host: the launcher is given a free port of its own
        result = measure(
            scripts,
            "--micro-batch",
            "2",
            "--",
            str(BIN / "deepspeed"),
            "--num_gpus",
            "2",
            "hf_trainer.py",
            "--deepspeed",
            "ds_config_hf.json",
            "--output_dir",
            str(scripts / "out"),
            "--max_steps",
            "20",
            "--use_cpu",
            "--report_to",
            "none",
        )
    assert result["status"] == "ok", result["error"]
    assert result["script"]["micro_batch_fed"] == 2 and result["script"]["samples_per_step"] == 4
    assert result["script"]["code_paths"] == {"chunked_loss": False, "liger": False}  # HF's own loss, no Liger
    assert all(rank["true_peak"]["peak_source"] == "allocator" for rank in result["ranks"])
    assert result["step_time_s"]["p50"] > 0


CHUNKED = """\
import argparse

import deepspeed
import torch
import transformers
from deepspeed.runtime.chunked_cross_entropy import install_chunked_causal_lm_loss

parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
parser.add_argument("--local_rank", type=int, default=-1)
args = parser.parse_args()
deepspeed.init_distributed(dist_backend="gloo")
config = transformers.LlamaConfig(
    vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128,
)
model = transformers.LlamaForCausalLM(config)
install_chunked_causal_lm_loss(model)
engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
for _ in range(40):
    ids = torch.randint(0, 1024, (engine.train_micro_batch_size_per_gpu(), 64))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
"""


def test_a_script_that_installs_deepspeeds_chunked_loss_is_seen_to(scripts: Path) -> None:
    """A raw loop training a transformers model with DeepSpeed's chunked cross-entropy installed on it."""
    (scripts / "chunked.py").write_text(CHUNKED)
    result = measure(scripts, "--", *RAW[:3], "chunked.py", *RAW[4:], "ds_config.json")
    assert result["status"] == "ok", result["error"]
    assert result["script"]["code_paths"] == {"chunked_loss": True, "liger": False}


def test_an_accelerate_script_is_measured(scripts: Path) -> None:
    result = measure(
        scripts,
        "--micro-batch",
        "2",
        "--",
        str(BIN / "accelerate"),
        "launch",
        "--num_processes",
        "2",
        "--use_deepspeed",
        "--deepspeed_config_file",
        "ds_config_accelerate.json",
        "accelerate_loop.py",
    )
    assert result["status"] == "ok", result["error"]
    assert result["script"]["micro_batch_fed"] == 2  # the loader's batch came from the autotuning arg_mappings


def test_a_script_crashing_on_its_own_stops_the_study_at_its_first_trial(scripts: Path) -> None:
    (scripts / "crash.py").write_text("import json\njson.load(open('missing_data.jsonl'))\n")
    db = f"sqlite:///{scripts / 'crash.db'}"
    done = dstune(
        "tune",
        "--model",
        "tiny-llama",
        "--gpus",
        "1",
        "--device",
        "cpu",
        "--seq-len",
        "64",
        "--trials",
        "3",
        "--launcher",
        "local",
        "--storage",
        db,
        "--study",
        "crash",
        "--",
        sys.executable,
        "crash.py",
        "--deepspeed",
        "ds_config_hf.json",
        cwd=scripts,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "No such file or directory: 'missing_data.jsonl'" in done.stderr.splitlines()[-1]
    from tuner.storage import Store

    store = Store.open(db)
    study = store.get_study("crash")
    assert study is not None and len(store.trials(study.id)) == 1


def test_a_hanging_script_is_ended_at_the_timeout_with_no_process_left(scripts: Path) -> None:
    hang = scripts / "hang.py"
    hang.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    result = measure(
        scripts,
        "--timeout",
        "20",
        "--",
        str(BIN / "torchrun"),
        "--nproc_per_node",
        "2",
        "hang.py",
        "--deepspeed_config",
        "ds_config.json",
    )
    assert result["status"] == "timeout" and "had not reached deepspeed.initialize" in result["error"]
    left = [p.pid for p in psutil.process_iter(["cmdline"]) if str(hang) in " ".join(p.info["cmdline"] or [])]
    left += [p.pid for p in psutil.process_iter(["cmdline"]) if "hang.py" in (p.info["cmdline"] or [])]
    assert not left


def test_a_config_over_a_memory_cap_is_recorded_oom(scripts: Path) -> None:
    """ZeRO-1's default reduce bucket (5e8 fp32 elements, 2 GB) cannot be allocated under a 1.5 GiB address space."""
    result = measure(scripts, "--memory-cap", "1536MiB", "--", *RAW, "ds_config.json")
    assert result["status"] == "oom", result["error"]


def test_recommend_and_the_dashboard_say_the_figures_are_the_commands(raw_study) -> None:
    """/v1/recommend's answer and the dashboard's pages for a script study: the command's config and a note."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from tuner.dashboard import router
    from tuner.recommend import recommend
    from tuner.storage import Store

    _, _, db = raw_study
    store = Store.open(db)
    study = store.get_study("raw")
    assert study is not None
    answer = recommend(store, store.workload_of(study.id)).to_dict()
    assert answer["source"] == "measured" and answer["ds_config"]["scheduler"]["type"] == "WarmupLR"
    assert any("figures are your training command's" in note for note in answer["notes"]), answer["notes"]
    assert answer["measured_with"] == "script" and answer["confirmation"]["status"] == "ok", answer["confirmation"]
    neither = "your command's model ran neither DeepSpeed's chunked cross-entropy loss nor Liger-Kernel's kernels"
    assert neither in answer["notes"], answer["notes"]
    app = FastAPI()
    app.state.store = store
    app.include_router(router)
    client = TestClient(app)
    page = client.get("/studies/raw").text
    assert "figures are your training command&#39;s" in page and 'id="confirmation"' in page
    best = store.best_trial(study.id)
    assert best is not None
    download = client.get(f"/studies/raw/trials/{best.number}/ds_config.json").json()
    assert download["optimizer"]["params"]["torch_adam"] is True
    # the API answers the study of the command's own model by name (its best trial: the config the command got)
    from tuner.api.app import create_app

    api = TestClient(create_app(db, None, insecure_no_auth=True))
    detail = api.get("/v1/studies/raw").json()
    assert detail["workload"]["model"]["family"] == "unknown" and detail["best"]["number"] == best.number
    assert detail["best"]["ds_config"]["train_micro_batch_size_per_gpu"] == best.trial.batch[0]
