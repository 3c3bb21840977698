"""``python -m tuner.measure.forkserver SOCKET``: start the node's fork server (:func:`daemon.main`)."""

import sys

from tuner.measure.forkserver.daemon import main

if __name__ == "__main__":
    sys.exit(main())
