"""Inside a rank's process: the short measured run one rank trains and what it reports.

``runner`` is the entry (``python -m tuner.measure.rank.runner RUN_DIR RANK``, or :mod:`forked` in a child of the
node's fork server), ``training`` the rank's phases (initialise, warm up, time the steps; ``settling`` says when a
warm-up has settled), ``trained_model`` the model it trains (``models`` builds the built-in one and wraps a
transformers one, ``birth`` decides where it is born: sharded under ZeRO-3, on the device in the training dtype
otherwise), ``layouts`` what a rank applies of a parallel layout (AutoTP, AutoEP, Ulysses and ALST).
What it measures: ``memory_probe`` (the bytes an engine holds, by category), ``true_peak`` with
``counting_allocator`` (the allocator's own high-water mark), ``numerics`` (step 0's loss and gradient norm on seeded
data). How it runs: ``launch_env`` (the launch environment its launcher planned, applied and read back),
``group_timeout`` (the run's timeout on every process group), ``alloc_conf`` (the caching allocator's settings),
``adam_choice`` (DeepSpeed's compiled Adam or torch's), ``chunked_loss``, ``lean`` (start-up work skipped).

A rank reads its spec and writes its results through :mod:`tuner.measure.run_protocol`; it never imports
:mod:`tuner.measure.driver`.
"""
