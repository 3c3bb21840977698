"""Count the bytes a DeepSpeed engine really holds, by category, from live tensor storages.

Used by measured runs on CPU (where no allocator statistics exist) and by the estimator's accuracy tests. Each
storage is counted once, in the first category that claims it, in this order: parameters (16-bit or fp32 model
weights, ZeRO-3 shards), gradients (``.grad`` tensors and ZeRO's gradient partitions), optimizer states (fp32
masters and Adam moments), buffers (communication buckets and ZeRO-3 persistent or prefetch buffers), then anything
else alive (``other``: the batch, counters, library state).
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

PROBED_CATEGORIES = ("parameters", "gradients", "optimizer_states", "buffers", "other")

# Attributes of DeepSpeed's optimizer wrappers (0.19) that hold gradient partitions or accumulators.
GRADIENT_ATTRIBUTES = (
    "averaged_gradients",
    "grads_in_partition",
    "fp32_groups_gradients_flat",
    "fp32_groups_gradients",
    "fp32_groups_gradient_flat_partition",
    "fp32_groups_flat_grads",  # FP16_Optimizer during the step
    "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
    "grad_partitions_flat_buffer",
)
# Attributes that hold fp32 master weights (the optimizer's own copy of the parameters).
MASTER_ATTRIBUTES = (
    "single_partition_of_fp32_groups",
    "fp32_partitioned_groups_flat",
    "fp32_groups_flat_partition",
    "fp32_groups_flat",
)
# Attributes that hold communication buckets and other temporary buffers.
BUFFER_ATTRIBUTES = (
    "ipg_buffer",
    "_DeepSpeedZeroOptimizer_Stage3__ipg_bucket_flat_buffer",
    "temp_grad_buffer_for_cpu_offload",
    "temp_grad_buffer_for_gpu_offload",
    "temp_grad_gpu_buffer",
    "grad_position",
    "lp_param_buffer",
    "param_buffer_of_bit16_for_cpu_offload_groups",
)


def _storage(tensor: torch.Tensor) -> tuple[int, int] | None:
    """(storage address, bytes) of a tensor, or None for an empty or meta tensor."""
    if tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return storage.data_ptr(), storage.nbytes()


def tensors_in(value: Any, depth: int = 4) -> Iterator[torch.Tensor]:
    """Tensors inside nested lists, tuples and dicts (and a tensor's ``.grad``)."""
    if isinstance(value, torch.Tensor):
        yield value
        if value.grad is not None:
            yield value.grad
    elif depth > 0 and isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item, depth - 1)
    elif depth > 0 and isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item, depth - 1)


def live_tensors() -> Iterator[torch.Tensor]:
    """Every tensor Python can reach right now."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on some library objects warns about deprecations
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor):
                    yield obj
            except ReferenceError:
                continue


class StorageLedger:
    """Assigns each storage to one category, first come first served."""

    def __init__(self) -> None:
        self.owner: dict[int, str] = {}
        self.bytes = dict.fromkeys(PROBED_CATEGORIES, 0)

    def claim(self, category: str, tensors: Iterable[torch.Tensor]) -> None:
        """Count the storages of ``tensors`` under ``category`` unless already counted."""
        for tensor in tensors:
            found = _storage(tensor)
            if found is None or found[0] in self.owner:
                continue
            self.owner[found[0]] = category
            self.bytes[category] += found[1]


def _inner_optimizer(engine: Any) -> torch.optim.Optimizer | None:
    wrapper = engine.optimizer
    return getattr(wrapper, "optimizer", wrapper)


def classify_engine_memory(engine: Any) -> dict[str, int]:
    """Bytes held right now by a DeepSpeed engine's process, by category (see module docstring)."""
    gc.collect()
    ledger = StorageLedger()
    params = list(engine.module.parameters())
    ledger.claim("parameters", params)
    ledger.claim("parameters", (p.ds_tensor for p in params if hasattr(p, "ds_tensor")))
    wrapper = engine.optimizer
    inner = _inner_optimizer(engine)
    ledger.claim("gradients", (p.grad for p in params if p.grad is not None))
    for name in MASTER_ATTRIBUTES:
        for tensor in tensors_in(getattr(wrapper, name, None)):
            if tensor.grad is not None:
                ledger.claim("gradients", [tensor.grad])
    for name in GRADIENT_ATTRIBUTES:
        ledger.claim("gradients", tensors_in(getattr(wrapper, name, None)))
    for name in MASTER_ATTRIBUTES:
        ledger.claim("optimizer_states", tensors_in(getattr(wrapper, name, None), depth=2))
    if inner is not None:
        masters = [p for group in inner.param_groups for p in group["params"]]
        ledger.claim("gradients", (p.grad for p in masters if p.grad is not None))
        ledger.claim("optimizer_states", masters)
        ledger.claim("optimizer_states", tensors_in(dict(inner.state)))
    for name in BUFFER_ATTRIBUTES:
        ledger.claim("buffers", tensors_in(getattr(wrapper, name, None)))
    for bucket in (getattr(wrapper, "ipg_buckets", None) or {}).values():
        ledger.claim("buffers", tensors_in(getattr(bucket, "buffer", None)))
    ledger.claim("other", live_tensors())
    return dict(ledger.bytes)


def _is_parameter_storage(address: int, params: list[torch.Tensor]) -> bool:
    """True when ``address`` is the storage a parameter holds right now (ZeRO-3 swaps storages as it gathers)."""
    return any((found := _storage(p)) is not None and found[0] == address for p in params)


@contextmanager
def count_saved_activations(params: Iterable[torch.Tensor] = ()) -> Iterator[dict[str, int]]:
    """Count unique storages autograd saves for backward inside the block, parameters excluded.

    Parameter storages are looked up when each tensor is saved, so ZeRO-3's gathered weights are excluded too.
    Yields a dict whose ``"bytes"`` entry holds the total once the block ends.
    """
    params = list(params)
    seen: dict[int, int] = {}
    result = {"bytes": 0}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        found = _storage(tensor)
        if found is not None and found[0] not in seen and not _is_parameter_storage(found[0], params):
            seen[found[0]] = found[1]
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield result
    result["bytes"] = sum(seen.values())


def _held_bytes(snapshot: dict[str, int]) -> int:
    return sum(snapshot[name] for name in PROBED_CATEGORIES if name != "other")


class PhaseRecorder:
    """Snapshots a DeepSpeed engine's memory by category at the three phases of one training step.

    ``forward``: right after the forward pass (activations counted separately, as saved-for-backward bytes);
    ``backward``: at the end of backward, before ZeRO-1/2 release their gradient buckets;
    ``step``: when the inner optimizer starts its step (fp32 master gradients alive).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.snapshots: dict[str, dict[str, int]] = {}
        self.activation_bytes = 0
        self.sweeps_s = 0.0  # seconds spent classifying live storages (what the probe adds to its step)
        self._armed = False
        wrapper = engine.optimizer
        # ZeRO-1 reduces all gradients after backward (reduce_gradients); ZeRO-1/2 release their buckets at the
        # end of backward (_release_ipg_buffers). The larger of the two snapshots is the backward peak.
        for name in ("reduce_gradients", "_release_ipg_buffers"):
            original = getattr(wrapper, name, None)
            if original is not None:
                setattr(wrapper, name, self._snapshot_before(original))
        inner = _inner_optimizer(engine)
        if inner is not None:
            inner.register_step_pre_hook(self._on_step)

    def _sweep(self) -> dict[str, int]:
        tick = time.perf_counter()
        snapshot = classify_engine_memory(self.engine)
        self.sweeps_s += time.perf_counter() - tick
        return snapshot

    def _snapshot_before(self, method: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if self._armed:
                snapshot = self._sweep()
                held = self.snapshots.get("backward")
                if held is None or _held_bytes(snapshot) > _held_bytes(held):
                    self.snapshots["backward"] = snapshot
            return method(*args, **kwargs)

        return wrapped

    def _on_step(self, *_: Any) -> None:
        if self._armed and "step" not in self.snapshots:
            self.snapshots["step"] = self._sweep()

    def train_step(
        self,
        *batch: torch.Tensor,
        mark: Callable[[str], None] | None = None,
        step: int = 0,
        loss_hook: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        """Run forward, backward and step once, taking every snapshot; ``mark`` (the true-peak instrument's) is told
        when each phase of step ``step`` begins; ``loss_hook`` sees the loss and gives what to backpropagate."""
        self._armed = True
        if mark:
            mark(f"step {step} probed forward")
        with count_saved_activations(self.engine.module.parameters()) as saved:
            loss = self.engine(*batch)
        if loss_hook is not None:
            loss = loss_hook(loss)
        self.activation_bytes = saved["bytes"]
        self.snapshots["forward"] = self._sweep()
        if mark:
            mark(f"step {step} probed backward")
        self.engine.backward(loss)
        if "backward" not in self.snapshots:
            self.snapshots["backward"] = self._sweep()
        if mark:
            mark(f"step {step} probed step")
        self.engine.step()
        self._armed = False
