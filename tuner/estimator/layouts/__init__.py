"""The estimator's view of each parallel layout, one module per layout: the rank's view of the model (what one rank
holds) and the memory and time terms the layout adds.

- ``ulysses``: Ulysses sequence parallelism and ALST's pieces (tiled MLP, tiled loss, checkpoint offload) in the
  activations, and their all-to-all and recompute time;
- ``autotp``: AutoTP's shards (the rank's view) and its all-reduces;
- ``autoep``: AutoEP's local experts (the rank's view), their ZeRO groups, the dispatch buffers and all-to-alls;
- ``zeropp``: ZeRO++ at ZeRO-3: hpZ's secondary partition, qwZ's and qgZ's staging buffers and wire bytes.

The ranks each layout's groups hold are :class:`tuner.workload.Ranks` (``Settings.ranks``).
"""
