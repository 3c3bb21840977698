"""``bench/gpu_validation.sh --dry-run``: every step of the one-call GPU validation runs on CPU ranks with tiny models
and a pretend card, each appending its line to ``validation.jsonl``; on a GPU the same lines run for real, so a
mistake found there would cost a GPU run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("preflight", "forked", "stages:", "oom-pair:fits", "oom-pair:over", "nvml", "transformers", "fused-adam")


@pytest.mark.slow
def test_the_gpu_validation_runs_every_step_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), "DS_ACCELERATOR": "cpu"}
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_validation.sh"), "--dry-run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400,
    )  # fmt: skip
    log = (tmp_path / "validation.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr + log[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    for step in STEPS:
        found = [line for line in lines if line["step"].startswith(step)]
        assert found, f"no line for {step}: {lines}\n{log[-3000:]}"
    failed = [line for line in lines if line["status"] not in ("ok", "skipped")]
    assert not failed, f"{failed}\n{log[-3000:]}"
    assert all(line["agrees"] for line in lines if line["step"].startswith("oom-pair"))
    assert (tmp_path / "gpu_terms_check.json").exists() and (tmp_path / "born_on_cuda.json").exists()
    assert json.loads((tmp_path / "born_on_cuda.json").read_text())[0]["status"] == "ok"
