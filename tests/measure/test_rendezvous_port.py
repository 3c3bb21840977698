"""The rendezvous port is free when the launcher picks it and can be taken before rank 0 binds it: the run is started
again on a new port instead of being recorded as the config's error (a real rank binding torch's TCPStore)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from tuner.measure.driver import local_launcher, processes
from tuner.measure.driver.places import free_port
from tuner.measure.options import MeasureOptions
from tuner.measure.run import run_measurement
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model

STORE_RANK = Path(__file__).with_name("store_rank.py")


@pytest.mark.slow
def test_a_rendezvous_port_taken_before_rank_0_binds_it_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)  # another process got the port between free_port() and rank 0's bind
        ports = iter([taken.getsockname()[1]])
        monkeypatch.setattr(local_launcher, "free_port", lambda: next(ports, None) or free_port())
        monkeypatch.setattr(processes, "default_entry", lambda: [sys.executable, str(STORE_RANK)])
        workload = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(64))
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {}}
        measurement = run_measurement(workload, TrialConfig(config), MeasureOptions(launcher="local", timeout=120))
    assert measurement.status == "ok", measurement.error
