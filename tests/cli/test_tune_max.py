"""``dstune tune --seq-len max``: flags it cannot honour are refused in one line (fast), and one real search on 2 CPU
ranks ends with a length measured within the memory and the next step measured over it (slow)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app
from tuner.storage import Store

runner = CliRunner()
DSTUNE = str(Path(sys.executable).with_name("dstune"))
TINY = ["--model", "tiny-llama", "--gpus", "2", "--device", "cpu", "--gpu-memory", "48MiB"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--seq-len", "max", "--global-batch", "8"], "global-batch"),
        (["--seq-len", "max", "--sampler", "random"], "sampler"),
        (["--seq-len", "max", "--pareto"], "pareto"),
        (["--seq-len", "max", "--allow-numerics-changes"], "allow-numerics-changes"),
        (["--seq-len", "max", "--tensor-parallel", "2"], "tensor-parallel"),
        (["--seq-len", "max", "--pin", "overlap_comm=true"], "pin"),
        (["--seq-len", "max", "--pin", "stage=7"], "pin"),
        (["--seq-len", "max", "--offload-checkpoints"], "dstune.offload_checkpoints"),  # needs CUDA ranks
        (["--seq-len", "maximum"], "seq-len"),
        (["--seq-len", "0"], "seq-len"),
    ],
)
def test_what_the_length_search_cannot_honour_is_one_line_exit_2(args: list[str], field: str) -> None:
    result = runner.invoke(app, ["tune", *TINY, *args])
    assert result.exit_code == 2, result.output
    assert result.output.strip().count("\n") == 0 and f"error: {field}:" in result.output


def _lengths(storage: str, base: str) -> dict[int, tuple[str, int | None, dict]]:
    """Each measured length of the search: its trial's status, measured peak and ds_config."""
    found = {}
    with Store.open(storage) as store:
        for study in store.list_studies():
            if study.name.startswith(f"{base}:"):
                (trial,) = store.trials(study.id)
                found[int(study.name.rsplit(":", 1)[1])] = (trial.status, trial.peak_bytes, trial.ds_config)
    return found


@pytest.mark.slow
@pytest.mark.deepspeed
def test_tune_seq_len_max_measures_the_longest_length_that_fits(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    storage = f"sqlite:///{tmp_path / 'dstune.db'}"
    search = ["--seq-len", "max", "--trials", "6", "--warmup", "1", "--steps", "1", "--launcher", "local"]
    command = [DSTUNE, "tune", *TINY, *search, "--launcher-env", "torchrun", "--storage", storage, "--study", "smax"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lengths = _lengths(storage, "smax")
    fitting = [n for n, (status, _, _) in lengths.items() if status == "ok"]
    assert fitting, lengths
    longest = max(fitting)
    _status, peak, config = lengths[longest]
    assert peak is not None and 0 < peak <= 48 * 2**20
    step = math.lcm(256, config.get("sequence_parallel_size", 1))
    assert lengths[longest + step][0] == "oom", lengths  # the next step measured over the budget
    assert f"longest measured: {longest:,} tokens" in done.stdout
    assert f"dstune best --study smax:{longest}" in done.stdout
    again = subprocess.run(command, capture_output=True, text=True, timeout=600)  # resumed: nothing measured again
    assert again.returncode == 0 and f"longest measured: {longest:,} tokens" in again.stdout
    assert "recorded before" in again.stdout and _lengths(storage, "smax") == lengths
