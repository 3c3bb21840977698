"""A ``dstune worker`` for the fault tests, as its own process: ``python worker_proc.py URL NAME LEASE_S``.

It is the real worker loop (:func:`tuner.worker.work`) with the real executor (each job runs as a study), only with a
short lease so that the tests do not wait a minute for a dead worker's lease to pass.
"""

import sys

from no_fsync import skip_sqlite_fsync

from tuner.storage import Store
from tuner.worker import work

if __name__ == "__main__":
    url, name, lease_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    skip_sqlite_fsync()  # as the test process itself (tests/conftest.py)
    with Store.open(url) as store:
        work(store, name, poll=0.2, lease_s=lease_s)
