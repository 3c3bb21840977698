"""A tuning job's ``allow_numerics_changes`` (``tune --allow-numerics-changes`` as data): validated with its pins
and carried into the study's settings."""

from __future__ import annotations

import pytest

from tuner.requests import FieldError, JobRequest, check_job
from tuner.worker import study_settings

WORKLOAD = {"model": "tiny-gpt2", "device": "cpu", "seq_len": 64}


def test_the_field_reaches_the_study_and_its_record() -> None:
    request = JobRequest(workload=WORKLOAD, allow_numerics_changes=True, pins={"bf16_master_weights": True})
    settings = study_settings(request, check_job(request))
    assert settings.allow_numerics_changes and settings.to_record()["allow_numerics_changes"] is True
    assert not study_settings(JobRequest(workload=WORKLOAD), "s").allow_numerics_changes


def test_a_numerics_pin_without_the_field_names_the_pins() -> None:
    with pytest.raises(FieldError) as refused:
        check_job(JobRequest(workload=WORKLOAD, pins={"bf16_master_weights": True}))
    assert refused.value.loc == ("pins",) and "bf16_master_weights" in str(refused.value)
