"""A rank program for launcher tests: the real ``tuner.measure.rank.runner``, with one fault injected into one rank.

Usage (as a launcher entry): ``python tests/fault_rank.py FAULT RANK_WITH_FAULT MARKER RUN_DIR RANK`` where FAULT is
``crash`` (an exception in the first training step), ``exit`` (the process dies without a report) or ``hang`` (the rank
starts a child process, then both sleep; the child carries MARKER in its command line so tests can look for orphans;
the rank first writes ``RUN_DIR/hung-rank-N``).
"""

import os
import subprocess
import sys

from tuner.measure.rank import runner

HUNG = "hung-rank-"  # a file RUN_DIR/hung-rank-N marks that rank N reached its hanging step


def main() -> int:
    fault, target, marker, run_dir, rank = sys.argv[1:6]
    if int(rank) == int(target):

        def faulty_step(self, engine, batches, probe=False):
            if fault == "crash":
                raise ZeroDivisionError("injected crash")
            if fault == "exit":
                os._exit(3)
            open(os.path.join(run_dir, f"{HUNG}{rank}"), "w").close()  # the test sees that the hang came
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", marker])
            import time

            time.sleep(3600)

        runner.TrainingProcess._train_step = faulty_step
    return runner.main([run_dir, rank])


if __name__ == "__main__":
    sys.exit(main())
