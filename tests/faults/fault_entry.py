"""A rank program for the fault tests: the real ``tuner.measure.rank.runner``, with one fault in one rank's training
step.

Usage (as a launcher entry): ``python fault_entry.py FAULT RANK_WITH_FAULT RUN_DIR RANK``. FAULT is ``sigkill`` (the
rank is SIGKILLed mid-step: no report, no cleanup), ``sigstop`` (the rank is stopped mid-step: a hang that no
timeout inside the process can end) or ``grow`` (the step writes :data:`GROWTH` bytes more than its estimate said, 64
MiB at a time: an estimate that is wrong, as the launcher's memory cap sees it; ``grow:BYTES`` that many). Just
before, the rank writes ``RUN_DIR/faulted-rank-N``.
"""

import os
import signal
import sys
import time

from tuner.measure.rank import runner

FAULTED = "faulted-rank-"  # a file RUN_DIR/faulted-rank-N marks that rank N reached its faulty step
GROWTH = 3 * 2**30
CHUNK = 64 * 2**20


def _grow(growth: int) -> None:
    held = []
    while len(held) * CHUNK < growth:
        held.append(bytearray(CHUNK))  # zero-filled: every page written, resident
        time.sleep(0.01)
    time.sleep(600)  # past the cap by now: the launcher kills the rank before this ends


def main() -> int:
    fault, target, run_dir, rank = sys.argv[1:5]
    if int(rank) == int(target):

        def faulty_step(self, engine, batches, probe=False):  # type: ignore[no-untyped-def]
            open(os.path.join(run_dir, f"{FAULTED}{rank}"), "w").close()  # the test sees that the fault came
            if fault.startswith("grow"):
                _grow(int(fault.partition(":")[2] or GROWTH))
            os.kill(os.getpid(), signal.SIGKILL if fault == "sigkill" else signal.SIGSTOP)

        runner.TrainingProcess._train_step = faulty_step
    return runner.main([run_dir, rank])


if __name__ == "__main__":
    sys.exit(main())
