"""The trace under fake tensors with models that do unusual things in forward: a fake tensor deep-copied (Dory copies
its cache layers) stays fake, and a model whose decoder layers run more than once per forward (Dory's recurrent
loops) is refused in one line, as the real ``dstune`` process exits (it aborted with a corrupt heap before)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from tiny_configs import shrunk_config
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

from tuner.profile.autograd_saved import _deepcopy_fake_aware, _patched


def test_a_fake_tensor_deep_copies_as_a_new_fake_tensor() -> None:
    with FakeTensorMode():
        tensor = torch.empty(4, 8, dtype=torch.bfloat16)
        with _patched(torch.Tensor, "__deepcopy__", _deepcopy_fake_aware):
            copied = copy.deepcopy({"keys": tensor, "again": tensor})
    assert is_fake(copied["keys"]) and copied["keys"].shape == (4, 8) and copied["keys"].dtype == torch.bfloat16
    assert copied["keys"] is copied["again"]  # the memo: one copy per original
    assert copied["keys"].untyped_storage()._cdata != tensor.untyped_storage()._cdata
    real = torch.ones(3)
    with _patched(torch.Tensor, "__deepcopy__", _deepcopy_fake_aware):
        assert torch.equal(copy.deepcopy(real), real)


def test_a_looped_model_is_refused_in_one_line_and_the_process_exits_2(tmp_path: Path) -> None:
    values = {key: value for key, value in shrunk_config("dory").items() if key != "model_type"}
    transformers.AutoConfig.for_model("dory", **values).save_pretrained(tmp_path / "dory")
    dstune = Path(sys.executable).with_name("dstune")
    command = [str(dstune), "estimate", "--model", str(tmp_path / "dory"), "--gpus", "1", "--seq-len", "64"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "DSTUNE_PROFILE_CACHE": str(tmp_path / "cache")},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.model_type" in lines[0] and "runs more than once per forward pass" in lines[0]
