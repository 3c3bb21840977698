"""Every model build has a memory and a time bound (tuner.profile.build_bound): real address-space limit, real
alarm, restored after."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tuner.profile.build_bound import build_bound
from tuner.workload import WorkloadError


def test_a_build_past_its_memory_bound_is_refused_naming_the_model_and_the_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGALRM)
    held: list[bytearray] = []
    refused = pytest.raises(WorkloadError, match=r"model: building this model takes more than 64.0 MiB")
    with refused, build_bound(extra_bytes=64 * 2**20):
        for _ in range(64):  # a build growing 16 MiB at a time, up to 1 GiB
            held.append(bytearray(16 * 2**20))
            time.sleep(0.02)
    assert len(held) < 64 and signal.getsignal(signal.SIGALRM) == before
    held.clear()


def test_a_build_past_its_time_bound_is_refused_and_an_outer_alarm_survives_it() -> None:
    fired: list[int] = []
    saved = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.alarm(30)
        refused = pytest.raises(WorkloadError, match=r"model: building this model takes longer than 1 s")
        with refused, build_bound(limit_s=1):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # a build that would not end
                sum(range(1000))
        left = signal.alarm(0)
        assert 0 < left <= 30 and not fired  # the outer alarm is set again, not spent
    finally:
        signal.signal(signal.SIGALRM, saved)


def test_the_cli_builds_within_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from tuner.cli.app import app
    from tuner.profile import build_bound as bound_module

    monkeypatch.setattr(bound_module, "BUILD_BYTES", 1)  # no build of 64 layers fits one byte more
    monkeypatch.setenv("DSTUNE_PROFILE_CACHE", str(tmp_path / "profiles"))
    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 64,
              "num_attention_heads": 4, "vocab_size": 1000}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(app, ["estimate", "--model", str(tmp_path / "config.json"), "--device", "cpu"])
    assert result.exit_code == 2 and "building this model takes more than" in result.output, result.output
