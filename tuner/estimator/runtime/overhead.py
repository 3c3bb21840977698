"""Memory outside the model's tensors: the CUDA overhead an estimate adds on top of its peak phase, and the host
bytes of each rank's process.

On CUDA the overhead is a sum of named terms (:mod:`.device`): the CUDA context, the NCCL communicators, the cuBLAS
workspaces and the caching allocator's reserve. The reserve is simulated on the step's plausible allocation sequence
(:mod:`.alloc_sequence`) unless the device kind sets a flat share; the defaults are calibrated from measured runs
(``bench/gpu_terms_check.py``). CPU runs add no device terms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.estimator.phases import Phase
from tuner.estimator.runtime.alloc_sequence import simulated_step
from tuner.estimator.runtime.device import KINDS, OTHER, TYPED, DeviceKind, OutsideAllocator, outside_allocator
from tuner.estimator.settings import Settings
from tuner.estimator.terms import NOTHING, Contribution, Detail, detail, details
from tuner.estimator.throughput.hardware import table_key
from tuner.workload import Workload

UNSIMULATED_SHARE = 0.07  # the allocator's reserve for a config whose tensors cannot fit anyway (not simulated)
OUT_OF_MEMORY = (Detail("allocator_out_of_memory", 1),)


@dataclass(frozen=True)
class Overhead:
    """Memory outside the model's tensors, per rank.

    ``device``: the CUDA device kind whose named terms (CUDA context, one NCCL term per communicator, cuBLAS
    workspaces, allocator reserve: :mod:`tuner.estimator.runtime.device`) a CUDA estimate adds; None: the kind the
    cluster's GPU type (``--gpu-type``), else the kind its GPU memory suggests
    (:func:`tuner.estimator.throughput.hardware.table_key`: H200, H100 or A100).
    ``cpu_process``: resident bytes of one rank's process on the host (libraries, Python). CPU runs add no device
    terms.
    """

    cpu_process_cuda: int = 3 * 2**30
    cpu_process_cpu: int = 450 * 2**20
    device: DeviceKind | None = None

    def kind_for(self, workload: Workload) -> DeviceKind:
        """The device kind of a CUDA workload: the one given, else its GPU type's, else guessed from its memory."""
        if self.device is not None:
            return self.device
        if workload.cluster.gpu_type:
            return TYPED[workload.cluster.gpu_type]
        return KINDS.get(table_key(workload), OTHER)


DEFAULT_OVERHEAD = Overhead()


def overhead_terms(
    workload: Workload,
    s: Settings,
    overhead: Overhead,
    phases: Mapping[str, Phase],
    recorded: Mapping[str, int],
    peak: int,
) -> tuple[dict[str, int], Contribution]:
    """The named device overhead terms of a CUDA workload at the ``peak`` phase's bytes (none on CPU), and the
    details they record: each term, their NCCL terms' sum (``nccl_buffers``) and the allocator simulation's figures.
    ``phases`` and ``recorded``: the estimate's phases and details so far."""
    if workload.cluster.device != "cuda":
        return {}, NOTHING
    kind = overhead.kind_for(workload)
    outside = outside_allocator(kind, s.ranks)
    terms, simulation = _device_terms(workload, s, (kind, outside), phases, recorded, peak)
    return terms, (*simulation, *details(terms), *detail("nccl_buffers", outside.nccl))


def _device_terms(
    workload: Workload,
    s: Settings,
    device: tuple[DeviceKind, OutsideAllocator],
    phases: Mapping[str, Phase],
    recorded: Mapping[str, int],
    peak: int,
) -> tuple[dict[str, int], Contribution]:
    """The named CUDA overhead terms of a device kind and the groups' communicators (``device``: the kind and the
    terms outside its allocator, :mod:`.device`), the allocator's reserve simulated on the step's plausible
    allocation sequence (:mod:`.alloc_sequence`) unless the kind sets a flat share, and the simulation's figures. The
    simulation gets the GPU memory the context and NCCL leave as its capacity, so it releases cached segments where
    the real allocator would (before an out-of-memory error) rather than reporting a reserve no run could hold."""
    kind, outside = device
    terms = kind.with_reserve(outside, peak)  # the reserve set below unless the kind's flat share set it
    if kind.allocator_share is not None:
        return terms, NOTHING
    # The allocator may use what the context and NCCL leave; it releases its cache before running out.
    room = workload.cluster.gpu_memory - outside.context - outside.nccl
    if peak + terms["cublas_workspace"] > room:  # cannot fit whatever the allocator does: no simulation
        terms["allocator_reserve"] = int(UNSIMULATED_SHARE * peak)
        return terms, OUT_OF_MEMORY
    short = NOTHING
    simulated = simulated_step(workload, s, phases, recorded, s.expandable_segments, room)
    if simulated is None:  # out of memory even so: report the unpressured reserve (the total will not fit)
        short = OUT_OF_MEMORY
        simulated = simulated_step(workload, s, phases, recorded, s.expandable_segments)
    assert simulated is not None  # no capacity: never out of memory
    terms["allocator_reserve"] = simulated.reserve
    return terms, (
        *short,
        *detail("simulated_peak_allocated", simulated.peak_allocated),
        *detail("simulated_peak_reserved", simulated.peak_reserved),
        *detail("allocator_cache_releases", simulated.releases),
    )
