"""Measured runs: one short real DeepSpeed run in fresh rank processes, and what it reports.

Inside each rank: ``runner`` is the entry (``python -m tuner.measure.runner RUN_DIR RANK``), ``training`` the rank's
phases (initialise, warm up, time the steps), ``rank_model`` the model it trains (``models`` builds the built-in ones
and ``birth`` decides where: sharded under ZeRO-3, on the device in the training dtype otherwise; ``ulysses`` and
``alst`` apply a trial's sequence parallelism, tiling and checkpoint offload, ``long_context_checks`` refuses what
cannot be measured, ``numerics`` records step 0's loss and gradient norm); ``run_protocol`` is
what a launcher and its ranks exchange (the spec, results, progress). Around the ranks: ``launcher`` runs them on this
machine (``rank_place``: where each runs and its torchrun environment; ``rank_process``: starting and stopping one;
``rank_outcome``: what its end says; ``oom``: whether a death was out of memory) and ``ray_launcher`` on a
Ray cluster; ``group_timeout`` puts the run's timeout on every process group; ``forkserver`` forks them from a node's
server that imported torch and DeepSpeed once; ``dispatch`` sends a study's runs to a launcher; ``measurement``,
``memory_probe``, ``true_peak`` and ``numerics`` (step-0 loss and gradient norm on seeded data) say what a run
measured; ``run`` is one run with its estimate beside it.
Submodules are imported by name (this package imports nothing, so pure callers never load torch).

May import: :mod:`tuner.workload`, :mod:`tuner.estimator`, torch, DeepSpeed, Ray. Knows nothing of databases or studies.
"""
