"""Keeping transformers' and torch's advice off stderr while a model is built or traced to describe it."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

import transformers


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """transformers' advisory messages (token ids outside a tiny vocabulary, use_cache turned off for checkpointing,
    reference kernels...) and Python warnings from transformers and torch kept off stderr while describing a model."""
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    torch_log = logging.getLogger("torch")
    torch_level = torch_log.level
    torch_log.setLevel(logging.CRITICAL)  # fake-tensor kernels log the errors a refused trace then reports
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        torch_log.setLevel(torch_level)


__all__ = ["quiet"]
