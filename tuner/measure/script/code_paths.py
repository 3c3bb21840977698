"""What a training command's model runs that the estimate must know and the user's script decides: DeepSpeed's
chunked cross-entropy (``install_chunked_causal_lm_loss`` sets it as a transformers model's ``loss_function``:
``deepspeed/runtime/chunked_cross_entropy.py``) and Liger-Kernel's kernels (its modules, such as ``LigerRMSNorm``,
or its functions bound as a module's ``forward`` or its class's, as ``apply_liger_kernel_to_<model type>`` and HF's
``use_liger_kernel`` install them). Read inside a rank from the engine's model after the timed steps, by names only:
nothing is imported, so a script without DeepSpeed's chunked loss or Liger installed reads both False. A loss the
script computes itself (calling ``chunked_cross_entropy`` in its own code, or Liger's functions by name) is not seen
on the model and reads False.

Example:
    >>> class ChunkedCausalLMLoss: ...
    >>> ChunkedCausalLMLoss.__module__ = CHUNKED_LOSS_MODULE
    >>> class Model:
    ...     def modules(self): return [self]
    >>> model = Model()
    >>> model._loss_function = ChunkedCausalLMLoss()
    >>> code_paths(model)
    {'chunked_loss': True, 'liger': False}
"""

from __future__ import annotations

from typing import Any

CHUNKED_LOSS_MODULE = "deepspeed.runtime.chunked_cross_entropy"
LIGER_PACKAGE = "liger_kernel"
WORDS = {"chunked_loss": "DeepSpeed's chunked cross-entropy loss", "liger": "Liger-Kernel's kernels"}


def code_paths(model: Any) -> dict[str, bool]:
    """Whether ``model`` (a ``torch.nn.Module``: the engine's ``module``) computes its loss with DeepSpeed's chunked
    cross-entropy and runs Liger-Kernel's kernels."""
    modules = model.modules() if callable(getattr(model, "modules", None)) else [model]
    chunked = liger = False
    for module in modules:
        chunked = chunked or _chunked_loss(module)
        liger = liger or _liger(module)
    return {"chunked_loss": chunked, "liger": liger}


def code_paths_line(paths: dict[str, Any] | None) -> str | None:
    """What ``best`` says of a training command's loss and kernels (None: not read, a run before dstune read them).

    >>> code_paths_line({"chunked_loss": True, "liger": False})
    "your command's model ran DeepSpeed's chunked cross-entropy loss, not Liger-Kernel's kernels"
    >>> code_paths_line({"chunked_loss": False, "liger": False})
    "your command's model ran neither DeepSpeed's chunked cross-entropy loss nor Liger-Kernel's kernels"
    """
    if not isinstance(paths, dict) or not all(isinstance(paths.get(key), bool) for key in WORDS):
        return None
    used = [words for key, words in WORDS.items() if paths[key]]
    unused = [words for key, words in WORDS.items() if not paths[key]]
    if not used:
        return f"your command's model ran neither {' nor '.join(unused)}"
    return f"your command's model ran {' and '.join(used)}" + (f", not {unused[0]}" if unused else "")


def _chunked_loss(module: Any) -> bool:
    """The module's own ``loss_function`` (transformers keeps a set one as ``_loss_function``) is DeepSpeed's."""
    own = vars(module) if hasattr(module, "__dict__") else {}
    loss = own.get("_loss_function", own.get("loss_function"))
    return loss is not None and _from(type(loss), CHUNKED_LOSS_MODULE)


def _liger(module: Any) -> bool:
    """The module is Liger's, or its forward (bound to it, or its class's) is Liger's function."""
    own = vars(module) if hasattr(module, "__dict__") else {}
    forward = own.get("forward")
    candidates = (type(module), getattr(type(module), "forward", None), getattr(forward, "__func__", forward))
    return any(candidate is not None and _from(candidate, LIGER_PACKAGE) for candidate in candidates)


def _from(thing: Any, package: str) -> bool:
    name = getattr(thing, "__module__", None)
    return isinstance(name, str) and (name == package or name.startswith(package + "."))


__all__ = ["CHUNKED_LOSS_MODULE", "LIGER_PACKAGE", "code_paths", "code_paths_line"]
