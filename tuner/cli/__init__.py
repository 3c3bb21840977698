"""The ``dstune`` command line (Typer + rich). A face: thin over :mod:`tuner.requests` (workloads are built through
its :class:`~tuner.requests.WorkloadRequest`), the estimator, the study, measured runs, storage, the API and the worker;
nothing below imports it. The study, storage, measurement, API and worker rooms are imported only when a command
that needs them runs.

``app`` (the Typer app, ``dstune``) registers one module per command: ``estimate``, ``measure``, ``tune`` (``tune``
and ``best``), ``serve`` and ``worker``. ``options`` declares the workload flags once, ``common`` the one-line error
handling and small helpers the commands share.
"""

from tuner.cli.app import app

__all__ = ["app"]
