"""dstune's start-up hook for a measured training command (Python imports ``sitecustomize`` at start-up from the
first folder on ``sys.path`` that has one; dstune puts this folder first on the command's ``PYTHONPATH``).

In a process of a run (``DSTUNE_SCRIPT_RUN`` names the run's folder) it installs
:mod:`tuner.measure.script.rank_hook`, then runs the ``sitecustomize`` this one hides, if the environment has one.
"""

import importlib.util
import os
import sys


def _install() -> None:
    try:
        from tuner.measure.script import rank_hook
    except ImportError:  # the command's Python does not have dstune on its path: dstune's own folder does
        sys.path.append(os.environ.get("DSTUNE_SCRIPT_ROOT", ""))
        from tuner.measure.script import rank_hook
    rank_hook.install()


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and os.path.dirname(spec.origin or "") != here:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("DSTUNE_SCRIPT_RUN"):
    _install()
_chain()
