"""Runtime buffers and overheads: memory outside the model's tensors on a CUDA device.

The named overhead terms an estimate adds on top of its peak (:mod:`.overhead`): the CUDA context and cuBLAS
workspaces of a device kind (:mod:`.device`), the NCCL communicators' buffers (:mod:`.nccl`), and the caching
allocator's reserve, simulated (:mod:`.allocator`) on a step's plausible allocation sequence
(:mod:`.alloc_sequence`).
"""
