"""Train with the HF Trainer on what ``dstune best --format hf`` prints, as a user would: a rank script under
torchrun, 2 gloo CPU ranks, given the ds_config, the printed notes and the model's ``config.json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def write_hf_export(folder: Path, config: dict[str, Any], notes: list[str], model: dict[str, Any]) -> Path:
    """``ds.json`` and ``notes.txt`` in ``folder`` (what ``best --format hf`` prints) and the model's ``model.json``,
    whose path it returns."""
    (folder / "ds.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "notes.txt").write_text("\n".join(notes) + "\n")
    (folder / "model.json").write_text(json.dumps(model))
    return folder / "model.json"


def train_on_two_cpu_ranks(script: Path, folder: Path, model: Path, out: Path) -> None:
    """Run ``script`` on 2 ranks with torchrun on ``folder``'s ``ds.json`` and ``notes.txt``; the test fails with its
    stderr if the script does."""
    ds_config, notes = folder / "ds.json", folder / "notes.txt"
    trained = subprocess.run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            str(script), str(ds_config), str(notes), str(model), str(out),
        ],
        capture_output=True, text=True, timeout=900, env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
