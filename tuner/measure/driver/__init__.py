"""Around the ranks, in the process that measures: start a run's ranks, place them, wait for them and collect what
their ends say.

The measuring launchers: ``local_launcher`` runs the ranks as processes on this machine, ``ray_launcher`` on a Ray
cluster (``ray_placement``: where a Ray run's ranks go; ``ray_call``: a whole measurement inside a Ray task).
Both share ``places`` (where each rank runs and its torchrun environment), ``processes`` (starting and stopping one
rank's process, spawned or forked from the node's :mod:`~tuner.measure.forkserver`), ``outcomes`` (what a rank's end
says, and the job's measurement from its ranks) and ``launch_env`` (the launcher's side of the workload's launch
environment: each rank's threads, cores and variables, and what the ranks reported back).
``gpu_lease`` gives concurrent local runs disjoint GPUs, ``host_memory`` refuses a run that would not fit this host,
``local_gpu`` reads this machine's GPU.

The driver starts a rank by its module path (:mod:`tuner.measure.rank.runner`) and never imports
:mod:`tuner.measure.rank` itself, so it loads no torch or DeepSpeed of its own to launch one.
"""
