"""Build DeepSpeed's CPU ops once, before the suite: a test that kills a run must never kill a build half-way.

Run by tests/run.sh with DS_ACCELERATOR=cpu and TORCH_EXTENSIONS_DIR set; builds are cached across runs.
"""

from deepspeed.accelerator import get_accelerator

for name in ("ShareMemCommBuilder", "FusedAdamBuilder", "CPUAdamBuilder"):
    get_accelerator().create_op_builder(name).load(verbose=False)
    print(f"DeepSpeed op ready: {name}")
