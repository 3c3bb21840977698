"""Model states: what ZeRO holds of the parameters, gradients and optimizer states on one rank, by stage.

ZeRO 0-2's flat groups and buckets (:mod:`.flat_states`), ZeRO-3's shards (:mod:`.stage3_states`) and the whole
parameters it gathers (:mod:`.stage3_gathered`), the partition sizes both cut (:mod:`.partitions`), the master
weights and optimizer moments (:mod:`.master_states`, :mod:`.muon`), the parameters as trained (:mod:`.trainable`,
4-bit bases: :mod:`.quantized`), their offloaded buffers' pinned host memory (:mod:`.pinned`) and the transient
buffers of their reductions and optimizer step (:mod:`.transients`).
"""
