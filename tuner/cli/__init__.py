"""The ``dstune`` command line (Typer + rich). A face: thin over the estimator, the study, measured runs and storage."""

from tuner.cli.app import app

__all__ = ["app"]
