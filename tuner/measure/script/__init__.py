"""The user's own training command, measured unchanged (the ``script`` measuring backend).

Around the command: ``command`` (what the user gave: the command, where its ds_config goes, its batch flags),
``placement`` (the trial's ds_config written over the user's, put where the command reads it, micro-batch and
accumulation on the command's own flags), ``launch`` (the command run as one process group, ended whole at the
timeout), ``readback`` (what the ranks wrote, as a Measurement) and ``failures`` (what the command's end says: out of
memory, its own error, a hang, the infrastructure). Inside its processes: ``hook/sitecustomize.py``, which Python
imports at start-up from a folder dstune puts first on ``PYTHONPATH``, installs ``rank_hook``: it wraps
``deepspeed.initialize`` and the engine's step, counts memory and writes one result per rank.

Importing this package loads nothing heavy; only ``rank_hook`` imports torch, inside the command's processes.
"""
