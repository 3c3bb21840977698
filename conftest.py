"""What pytest skips when it collects doctests (pyproject runs ``--doctest-modules`` over ``tests`` and ``tuner``).

Modules with no doctests that import a training stack (torch, Ray) at import time would only slow collection down,
Alembic's migration scripts run only under Alembic, and ``tests/prebuild_ops.py`` compiles DeepSpeed's ops when
imported. Test modules themselves are collected as usual.
"""

collect_ignore = [
    "tuner/storage/migrations",
    "tuner/measure/rank/models.py",
    "tuner/measure/rank/memory_probe.py",
    "tuner/measure/driver/ray_launcher.py",
    "tests/prebuild_ops.py",
    "tests/saved_bytes.py",
]
