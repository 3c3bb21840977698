"""A private local Ray dies with the process that started it, even a SIGKILLed one (tuner.measure.driver.ray_reaper):
its dashboard and runtime-env agents used to live on about 70 s, waiting on a dead GCS."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow  # starts a local Ray

DRIVER = """
import json, sys, time
import psutil
from tuner.measure.driver.ray_launcher import ensure_ray
from tuner.measure.driver.ray_reaper import ray_descendants
ensure_ray(num_cpus=1)
me = psutil.Process()
while True:
    agents = ray_descendants(me)
    names = {psutil.Process(pid).name() for pid, _ in agents if psutil.pid_exists(pid)}
    if {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names or time.sleep(0.2):
        break
print(json.dumps(sorted(agents)), flush=True)
time.sleep(3600)
"""


def _alive(noted: list[list[float]]) -> list[int]:
    alive = []
    for pid, started in noted:
        try:
            if psutil.Process(int(pid)).create_time() == started:
                alive.append(int(pid))
        except psutil.Error:
            continue
    return alive


def test_a_sigkilled_driver_leaves_no_ray_agent_behind(tmp_path: Path) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True
    )
    try:
        assert driver.stdout is not None
        noted = json.loads(driver.stdout.readline())  # Ray is up, its agents started
        assert noted, "no process under the raylet"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 30  # the agents alone took about 70 s; the reaper stops them within seconds
    while _alive(noted):
        assert time.monotonic() < deadline, f"still alive: {_alive(noted)}"
        time.sleep(0.2)
