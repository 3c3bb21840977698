"""Build DeepSpeed's CPU ops once, before the suite: a test that kills a run must never kill a build half-way.

Run by tests/run.sh with DS_ACCELERATOR=cpu and TORCH_EXTENSIONS_DIR set; builds are cached across runs.
"""

from deepspeed.accelerator import get_accelerator

from tuner.measure.op_builds import use_environment_ninja

use_environment_ninja()  # the ninja the runs use: another one would read this build as stale and redo it

for name in ("ShareMemCommBuilder", "FusedAdamBuilder", "CPUAdamBuilder"):
    get_accelerator().create_op_builder(name).load(verbose=False)
    print(f"DeepSpeed op ready: {name}")

from tuner.measure.rank.counting_allocator import counting_allocator  # noqa: E402  (after the ops: same build folder)

if counting_allocator() is None:
    raise SystemExit(
        "the counting allocator (tuner/measure/rank/counting_allocator.cpp) did not build: true peaks need it"
    )
print("Counting allocator ready")
