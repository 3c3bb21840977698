"""Search spaces: declarative YAML spaces (built-ins shipped in ``builtin/``) turned into DeepSpeed configs.

May import: :mod:`tuner.workload`, :mod:`tuner.estimator` (its config resolution), PyYAML. Never Optuna's storage,
SQL, Ray or torch: a space only asks an Optuna-like trial for values. Optuna is never imported here:
:meth:`SearchSpace.suggest` takes any object with Optuna's ``suggest_categorical`` / ``suggest_int`` /
``suggest_float`` methods (:class:`TrialLike`).

Modules: ``errors`` (:class:`SpaceError`, :class:`InfeasibleConfig`), ``conditions`` (``when`` clauses),
``parameters`` (:class:`Parameter`), ``suggestion`` (:class:`Suggestion`, :func:`config_key`), ``space``
(:class:`SearchSpace`), ``loader`` (reading and validating files, the built-in spaces), ``parameter_entry`` (one
parameter's entry, its ``when`` included, read into a :class:`Parameter`).

File format
-----------
A space file is a YAML mapping with these top-level fields (no others)::

    version: 1                      # optional; only 1 exists
    description: ZeRO settings      # optional
    base:                           # optional: a ds_config fragment every trial starts from
      optimizer: {params: {lr: 1.0e-4}}
      gradient_clipping: 1.0
    parameters:                     # name -> spec, in order; names are identifiers
      stage:
        kind: categorical           # categorical | int | float
        choices: [0, 1, 2, 3]       # categorical only: scalars (null, bool, int, float, string)
        key: zero_optimization.stage  # the dotted ds_config key the value is written to
        default: 0                  # required: the value when not searched (DeepSpeed's default where it has one)
      reduce_bucket_size:
        kind: int
        low: 10_000_000             # int/float: low and high required, inclusive
        high: 1_000_000_000
        log: true                   # optional: log scale (needs low > 0; no step with log)
        step: 1                     # optional: the grid step (int >= 1, float > 0)
        multiple_of: 2              # optional (int): the value written is rounded to a multiple (Optuna keeps its own)
        key: zero_optimization.reduce_bucket_size
        default: 500_000_000
        when: stage >= 1            # optional condition(s) on parameters defined above
        grid: [50_000_000, 500_000_000]  # optional: explicit values for the grid baseline
        help: ZeRO reduce bucket in elements   # optional
      activation_checkpointing:
        kind: categorical
        choices: [false, true]
        train: activation_checkpointing  # instead of `key`: a training setting outside the ds_config
        default: false

* ``key`` or ``train``, exactly one. ``train`` names a :class:`~tuner.workload.TrialConfig` field that a ds_config does
  not carry; only ``activation_checkpointing`` is supported, returned in :attr:`Suggestion.trial`.
* ``default: null`` leaves the key unset, so DeepSpeed decides (``overlap_comm``'s default depends on the stage); for
  a ``train`` parameter or a batch key it means the workload's own value.
* ``when``: one clause ``NAME OP VALUE`` with ``OP`` one of ``== != >= <= > < in``, ``not in``, several joined with
  ``and`` or given as a YAML list (all must hold). ``VALUE`` is read as YAML: ``3``, ``cpu``, ``true``, ``[1, 2]``.
  ``NAME`` must be a parameter defined above, or a workload fact: ``trainable_params``, ``frozen_params`` (0 for
  full fine-tuning) or ``optimizer_state_bytes`` (the trainable parameters' fp32 master and Adam moments, 12 B each,
  before ZeRO shards them; sizes like ``256MiB`` read), ``seq_len``, ``world_size``, ``attention_heads`` or
  ``cpu_ranks`` (1 when the ranks train on CPU), e.g.
  ``optimizer_state_bytes >= 256MiB``. A categorical parameter with key ``sequence_parallel_size`` offers only the
  degrees Ulysses can run on the workload (:func:`tuner.workload.sequence_parallel_problem`). One list item may
  give alternatives joined by ``or`` (``frozen_params == 0 or optimizer_state_bytes >= 256MiB``); ``and`` and ``or``
  do not mix in one item. A parameter whose condition fails (or names an inactive parameter) is
  not suggested and writes nothing, so ``stage3_*`` keys appear only in ZeRO-3 configs: Optuna's way of handling
  conditional spaces.
* ``nvme_choices`` (categorical only): extra choices offered only when an NVMe path is given to
  :meth:`SearchSpace.suggest`; every offload section whose ``device`` is ``nvme`` then gets that ``nvme_path``.
* Batch sizes: a parameter with key ``train_micro_batch_size_per_gpu`` is the micro-batch, one with key
  ``gradient_accumulation_steps`` the accumulation (it must come after the micro-batch). Without a global batch,
  both are searched freely (or taken from the workload when absent). With a fixed global batch, the accumulation is
  derived: ``micro × accumulation × data-parallel world size == global batch``. A categorical micro-batch is then
  offered only the choices that divide ``global batch / world size``; a micro-batch that cannot divide it (an int
  parameter or a pin) raises :class:`InfeasibleConfig`, which the study records as a pruned trial.
  ``train_batch_size`` is always written by the space and may not be a parameter key nor appear in ``base``.
* Precision is not a parameter: the workload's ``TrainSpec.precision`` decides the ``bf16``/``fp16`` section (a
  ``bf16``/``fp16`` section in ``base`` supplies extra settings for that precision and is dropped for the other).
  An ``optimizer`` section in ``base`` without a ``type`` gets the workload's optimizer (``Adam`` or ``AdamW``).
* Large integers: write ``500_000_000`` or ``5.0e+8``; PyYAML reads ``5e8`` as a string.

Every mistake raises :class:`SpaceError`, whose message names the file and the key, e.g.
``default.yaml: parameters.micro_batch.low: must be a positive integer``.

Example:
    >>> import optuna
    >>> from tuner.space import default_space_path, load_space
    >>> from tuner.workload import ClusterSpec, Workload, load_builtin_model
    >>> space = load_space(default_space_path(), pins={"stage": 3})
    >>> workload = Workload(load_builtin_model("tiny-gpt2"), ClusterSpec(gpus_per_node=8))
    >>> trial = optuna.create_study().ask()
    >>> suggestion = space.suggest(trial, workload, global_batch=64)
    >>> suggestion.trial.ds_config["zero_optimization"]["stage"], suggestion.trial.ds_config["train_batch_size"]
    (3, 64)
"""

from tuner.space.errors import InfeasibleConfig, SpaceError
from tuner.space.loader import default_space_path, load_space, parse_space, resolve_space, space_dir, space_names
from tuner.space.parameters import Parameter, TrialLike
from tuner.space.space import SearchSpace, check_global_batch
from tuner.space.suggestion import Suggestion, config_key

__all__ = [
    "InfeasibleConfig",
    "Parameter",
    "SearchSpace",
    "SpaceError",
    "Suggestion",
    "TrialLike",
    "check_global_batch",
    "config_key",
    "default_space_path",
    "load_space",
    "parse_space",
    "resolve_space",
    "space_dir",
    "space_names",
]
