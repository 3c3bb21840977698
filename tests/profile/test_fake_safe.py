"""The trace under fake tensors with models that do unusual things in forward: a fake tensor deep-copied (Dory copies
its cache layers) stays fake, and a model whose decoder layers run more than once per forward (Dory's recurrent
loops) is estimated, each run's saved tensors counted, as the real ``dstune`` process runs it (it aborted with a
corrupt heap once, and was refused in one line before)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from saved_bytes import saved_bytes
from tiny_configs import shrunk_config
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

from tuner.profile import ProfileCache, model_profile
from tuner.profile.autograd_saved import _deepcopy_fake_aware, _patched
from tuner.workload import load_hf_config


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


def test_a_looped_model_counts_every_run_of_its_looped_layers(tmp_path: Path) -> None:
    """Dory runs its recurrent block ``n_recurrent_loops`` times: those layers are a kind of their own (``L<i>x2``)
    whose bytes are both runs', the copy keeps every layer (its forward indexes them by the config). Truth: the
    bytes transformers' own model saves (``tests/saved_bytes.py``), with and without checkpointing; the CLI
    estimates the saved file and exits 0."""
    values = {key: value for key, value in shrunk_config("dory").items() if key != "model_type"}
    transformers.AutoConfig.for_model("dory", **values).save_pretrained(tmp_path / "dory")
    config, _ = load_hf_config(str(tmp_path / "dory" / "config.json"))
    profile = model_profile(config, 64, "bf16", None, (False, True), ProfileCache(tmp_path / "profiles"))
    assert any(kind.endswith("x2") for kind in profile.layer_kinds)
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(tmp_path / "dory"), dtype=torch.bfloat16
        )
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        real = saved_bytes(model, torch.randint(0, 500, (2, 64)))
        found = profile.activation_bytes(64, "bf16", profile.attention, checkpointing, 2)
        assert found is not None and found[0] == real, checkpointing
    dstune = Path(sys.executable).with_name("dstune")
    command = [str(dstune), "estimate", "--model", str(tmp_path / "dory"), "--gpus", "1", "--seq-len", "64"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "DSTUNE_PROFILE_CACHE": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
