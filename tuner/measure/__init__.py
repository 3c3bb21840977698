"""Measured runs: one short real DeepSpeed run in fresh rank processes, and what it reports.

The room is split by the process boundary:

- :mod:`tuner.measure.rank`: what runs inside a rank's process (the entry ``python -m tuner.measure.rank.runner
  RUN_DIR RANK``, the training phases, the model and where it is born, the memory probe, the counting allocator and
  the true peak, the numerics, the launch environment applied, the layouts a rank applies, a forked rank's start).
- :mod:`tuner.measure.driver`: what runs around the ranks, in the process that measures (the measuring launchers,
  local and Ray, the ranks' places and processes, waiting and collecting their outcomes, the launch environment
  planned, GPU leases, the host-memory refusal).
- :mod:`tuner.measure.forkserver`: the node's fork server, which imported torch and DeepSpeed once and forks ranks.
- :mod:`tuner.measure.backends`: what "measure one trial" means (dstune's own trainer, the user's script), each
  backend starting its runs through a measuring launcher; :mod:`tuner.measure.script`: the script backend's parts.

At the top sit the room's entrances and what both sides agree on: ``run`` (one run with its estimate beside it),
``dispatch`` (a study's runs, as many at once as fit), ``options`` (how a run is measured), ``run_protocol`` (what a
launcher and its ranks exchange through the run's folder), ``measurement`` (what a run reports), ``oom`` (whether a
death was out of memory), ``op_builds`` (DeepSpeed's compiled ops a run will build), ``layout_checks`` and
``long_context_checks`` (what a run refuses before any rank starts, checked again inside the rank).
Submodules are imported by name (this package imports nothing, so pure callers never load torch).

May import: :mod:`tuner.workload`, :mod:`tuner.estimator`, torch, DeepSpeed, Ray. Knows nothing of databases or studies.
"""
