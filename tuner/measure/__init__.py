"""Measured runs: one short real DeepSpeed run in fresh rank processes, and what it reports.

``runner`` runs inside each rank (``python -m tuner.measure.runner``); ``launcher`` starts ranks on this machine and
``ray_launcher`` on a Ray cluster; ``dispatch`` sends a study's runs to them; ``measurement`` and ``memory_probe``
say what a run measured; ``models`` builds the built-in models and ``birth`` decides where a rank builds them
(sharded under ZeRO-3, on the device in the training dtype otherwise); ``run`` is one run with its estimate beside it.
Submodules are imported by name (this package imports nothing, so pure callers never load torch).

May import: :mod:`tuner.workload`, :mod:`tuner.estimator`, torch, DeepSpeed, Ray. Knows nothing of databases or studies.
"""
