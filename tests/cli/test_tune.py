"""``dstune tune`` / ``dstune best`` end to end on CPU: real local Ray, real DeepSpeed, real SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("ray")

from postgres import postgres_url  # noqa: F401  (fixture)

from tuner.storage import Store
from tuner.units import format_bytes

pytestmark = pytest.mark.deepspeed
DSTUNE = str(Path(sys.executable).with_name("dstune"))
# A small workload whose configs take seconds on CPU; 64 MiB of "GPU" memory prunes the big buckets.
WORKLOAD = ["--model", "tiny-gpt2", "--gpus", "1", "--seq-len", "64", "--device", "cpu", "--gpu-memory", "64MiB"]
FAST = ["--global-batch", "8", "--warmup", "2", "--steps", "2", "--seed", "3"]


def tune(storage: str, study: str, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DSTUNE, "tune", *WORKLOAD, *FAST, "--storage", storage, "--study", study, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def trials_of(storage: str, study: str) -> list:
    with Store.open(storage) as store:
        record = store.get_study(study)
        return store.trials(record.id) if record else []


def wait_until_measuring_after_a_result(
    storage: str, study: str, process: subprocess.Popen | None = None, timeout: float = 1200
) -> None:
    """Block until the study has a finished trial and another one running (the moment to interrupt it); fail if that
    never comes, or the tuner ended first. The deadline is generous: a fresh clone on a loaded host builds
    DeepSpeed's ops first."""
    deadline = time.monotonic() + timeout
    while True:
        trials = trials_of(storage, study)
        if any(t.status == "ok" for t in trials) and any(t.status == "running" for t in trials):
            return
        assert process is None or process.poll() is None, f"the tuner ended (code {process.returncode}) first"
        assert time.monotonic() < deadline, f"no result and a run in flight after {timeout:.0f} s: {trials}"
        time.sleep(0.5)


def test_tune_prunes_measures_records_and_exports(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'dstune.db'}"
    # the seeded random sampler proposes the same configs whatever the runs measure, so this study always meets
    # configs that cannot fit (TPE follows the throughput guide, whose picks fit and depend on measured speeds)
    done = tune(storage, "e2e", "--trials", "8", "--sampler", "random")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "top configs" in done.stdout and "best: trial" in done.stdout

    trials = trials_of(storage, "e2e")
    statuses = [t.status for t in trials]
    assert "ok" in statuses and "pruned" in statuses
    for trial in trials:
        if trial.status == "pruned":
            assert trial.prune_reason
            assert trial.constraint is None or trial.constraint > 0
        if trial.status == "ok":
            assert trial.tokens_per_s > 0 and trial.peak_bytes > 0 and trial.estimate["per_gpu"]["total"] > 0
    keys = [t.config_key for t in trials]
    assert len(keys) == len(set(keys)), "a config was recorded twice"
    # its output went to a pipe (a file, a CI log): no live bar there, one line per trial as each ended
    lines = {int(line.split(":")[0].split()[1]): line for line in done.stdout.splitlines() if line.startswith("trial ")}
    assert {t.number for t in trials} <= set(lines), done.stdout
    for trial in trials:
        if trial.status == "ok" and not (trial.measurement or {}).get("stopped_early"):
            figures = (
                f"trial {trial.number}: ok, {trial.tokens_per_s:,.0f} tokens/s, peak {format_bytes(trial.peak_bytes)}"
            )
            assert lines[trial.number].startswith(figures), lines[trial.number]
        if trial.status == "pruned":
            assert lines[trial.number].startswith(f"trial {trial.number}: pruned · ZeRO-"), lines[trial.number]

    out = tmp_path / "best.json"
    exported = subprocess.run(
        [DSTUNE, "best", "--study", "e2e", "--storage", storage, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    config = json.loads(out.read_text())
    best = max((t for t in trials if t.status == "ok"), key=lambda t: t.tokens_per_s)
    assert config == best.ds_config
    from tuner.space.dsconfig import validate_with_deepspeed

    validate_with_deepspeed(config, world_size=1)
    hf = subprocess.run(
        [DSTUNE, "best", "--study", "e2e", "--storage", storage, "--format", "hf"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert hf.returncode == 0 and json.loads(hf.stdout)["train_micro_batch_size_per_gpu"] == "auto"
    assert "per_device_train_batch_size" in hf.stderr


def test_sigkill_mid_study_then_resume_loses_nothing_and_repeats_nothing(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'dstune.db'}"
    command = [DSTUNE, "tune", *WORKLOAD, *FAST, "--storage", storage, "--study", "resume", "--trials", "10"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_until_measuring_after_a_result(storage, "resume", process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    before = {t.config_key: t for t in trials_of(storage, "resume")}
    finished_before = {k: t.tokens_per_s for k, t in before.items() if t.status == "ok"}
    assert finished_before, "no trial finished before the kill"

    done = tune(storage, "resume", "--trials", "10")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    after = {t.config_key: t for t in trials_of(storage, "resume")}
    for key, tokens in finished_before.items():  # nothing finished was lost or re-measured
        assert after[key].status == "ok" and after[key].tokens_per_s == tokens and after[key].attempts == 1
    assert not [t for t in after.values() if t.status == "running"]
    assert all(t.attempts <= 2 for t in after.values())  # a stale trial is retried once at most
    import optuna

    study = optuna.load_study(study_name="resume", storage=storage)
    assert len(study.trials) >= 10
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]


def test_tune_on_postgresql_with_gp_and_pareto(postgres_url: str) -> None:  # noqa: F811
    """PostgreSQL backend, the GP sampler and the two-objective (throughput, peak memory) study, through Ray."""
    done = tune(postgres_url, "pg", "--trials", "4", "--sampler", "gp", "--pareto")
    assert done.returncode in (0, 1), done.stderr[-3000:]
    trials = trials_of(postgres_url, "pg")
    assert len(trials) >= 1 and all(t.status != "running" for t in trials)
    import optuna

    study = optuna.load_study(study_name="pg", storage=postgres_url)
    assert len(study.directions) == 2 and len(trials) == 4 <= len(study.trials)  # 4 distinct configs
    measured = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert all(len(t.values) == 2 and t.values[1] > 0 for t in measured)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--sampler", "cmaes"], "sampler"),
        (["--trials", "0"], "trials"),
        (["--timeout", "eight hours"], "timeout"),
        (["--pin", "stage"], "pin"),
        (["--pin", "stage=7"], "stage"),
        (["--pin", "no_such_knob=1"], "no_such_knob"),
        # a local Ray is one node: every run would wait 60 s for a second node and fail (3 of 6 trials, by hand)
        (["--gpus", "2", "--nodes", "2"], "nodes"),
        (
            ["--gpus", "2", "--nodes", "2", "--launcher", "local", "--hpz", "2", "--pin", "stage=2"],
            "hpz_partition_size",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_field(tmp_path, args: list[str], field: str) -> None:
    done = tune(f"sqlite:///{tmp_path / 'x.db'}", "bad", *args, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert field in done.stderr and "Traceback" not in done.stderr


def test_bad_space_file_is_named(tmp_path) -> None:
    space = tmp_path / "mine.yaml"
    space.write_text(
        "parameters:\n  stage:\n    kind: categorical\n    choices: []\n    key: zero_optimization.stage\n"
    )
    done = tune(f"sqlite:///{tmp_path / 'x.db'}", "bad", "--space", str(space), timeout=120)
    assert done.returncode == 2
    assert "mine.yaml" in done.stderr and "parameters.stage" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])  # SIGTERM: timeout, systemd, docker stop
def test_ctrl_c_stops_after_recording_what_finished(tmp_path, stop: signal.Signals) -> None:
    """Interrupted once a run finished and another is in flight: it stops, says so, and what finished is recorded.
    Its output goes to files, not pipes nobody reads while it runs (a full pipe would block the tuner), and every wait
    is on a condition: the moment to interrupt, then the tuner's exit (bounded generously for a loaded host). Its
    runs go through the local launcher: what Ctrl-C does is the loop's, and a local Ray's start-up has a fixed 30 s
    limit of Ray's own that a loaded host misses ("The current node timed out during startup")."""
    storage = f"sqlite:///{tmp_path / 'dstune.db'}"
    study = ["--storage", storage, "--study", "ctrlc", "--trials", "30", "--launcher", "local"]
    command = [DSTUNE, "tune", *WORKLOAD, *FAST, *study]
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        # As from a terminal: a test runner started in the background (``pytest &`` in a script) ignores SIGINT, and
        # an ignored signal stays ignored across exec, so the tuner would never see this Ctrl-C.
        process = subprocess.Popen(
            command,
            stdout=stdout,
            stderr=stderr,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )

    def output() -> str:
        return f"stdout: {out.read_text()[-3000:]}\nstderr: {err.read_text()[-3000:]}"

    try:
        try:
            wait_until_measuring_after_a_result(storage, "ctrlc", process)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{output()}") from None
        process.send_signal(stop)
        code = process.wait(timeout=900)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "interrupted" in out.read_text(), output()
    assert stop == signal.SIGINT or (code == 143 and "terminated (SIGTERM)" in err.read_text()), output()
    trials = trials_of(storage, "ctrlc")
    assert any(t.status == "ok" for t in trials)
    assert not [t for t in trials if t.status in ("running", "pending")]
    assert len(trials) < 30
