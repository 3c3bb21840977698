"""Which variables a launch may set for its ranks (:func:`check_variable`): an allow-list of what launchers and their
users set for speed, with bounded values. Pure.

A launch variable reaches every rank of every measured run, on the worker that runs a queued job too, so it must not
be able to run code or read or write files there: the loader's (``LD_*``), Python's (``PYTHON*``), search paths and
plug-ins are refused, and a value holds no path. What is allowed, by name:

- threads and binding: ``OMP_*``, ``GOMP_*``, ``KMP_*``, ``MKL_*``, ``OPENBLAS_*`` (``OMP_NUM_THREADS``...);
- collectives: ``NCCL_*`` and ``TORCH_NCCL_*`` (``NCCL_ALGO``, ``NCCL_SOCKET_IFNAME``...);
- the allocator and the device queue: :data:`NAMED` (``PYTORCH_CUDA_ALLOC_CONF``, ``CUDA_DEVICE_MAX_CONNECTIONS``...);

never a name that holds one of :data:`REFUSED_PARTS` (``NCCL_NET_PLUGIN``, ``NCCL_DEBUG_FILE``, ``OMP_TOOL_LIBRARIES``,
``NCCL_TOPO_FILE``: they load shared objects or name files). A value is at most :data:`MAX_VALUE` characters of
:data:`VALUE`: letters, digits and ``_ . , : = + ^ -`` (no ``/``, no shell character: the exports print these in a
command line); a thread count at most :data:`MAX_THREADS`, any other number at most :data:`MAX_NUMBER`; and nothing
that looks like a credential (:func:`looks_secret`): secrets are no launch setting and would be shown with the run.

Example:
    >>> check_variable("OMP_NUM_THREADS", "4")
    >>> check_variable("LD_PRELOAD", "x.so")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tuner.workload.errors.WorkloadError: launch-var: 'LD_PRELOAD' is not a variable a launch may set (allowed: ...)
"""

from __future__ import annotations

import re

from tuner.workload.errors import WorkloadError

PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "NCCL_", "TORCH_NCCL_")
NAMED = frozenset(
    {
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
        "PYTORCH_HIP_ALLOC_CONF",
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_MODULE_LOADING",
        "CUDA_DEVICE_ORDER",
        "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT",
    }
)
# words of a name (split at _) that load code, name a file or a folder, reach a library or another host: refused
# under any prefix (NCCL_COMM_ID and NCCL_RAS_ADDR point a rank's bootstrap or its listener at an address)
REFUSED_PARTS = frozenset(
    {"PLUGIN", "FILE", "PATH", "DIR", "LIB", "LIBRARY", "LIBRARIES", "TOOL", "TOOLS", "PRELOAD", "DUMP", "SO"}
    | {"ADDR"}
)
REFUSED_NAMES = frozenset({"NCCL_COMM_ID"})
VALUE = re.compile(r"[A-Za-z0-9_.,:=+^-]*")
MAX_VALUE = 256
MAX_THREADS = 1024  # threads per rank: several times the cores of the largest nodes
MAX_NUMBER = 2**40  # any other number (NCCL_BUFFSIZE bytes, timeouts): beyond it a typo, or an overflow
THREAD_NAMES = re.compile(r".*(NUM_THREADS|THREAD_LIMIT|NTHREADS|MAX_CONNECTIONS|NCHANNELS)")
# what API tokens look like: a known prefix, or a long run of letters and digits mixed
SECRET_SHAPES = re.compile(
    r"(?:hf_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|sk-|sk_live_|sk_test_|rk_live_|xox[abprs]-|AKIA|ASIA|glpat-|ya29\.|"
    r"AIza|npm_|pypi-|dapi|eyJ)[A-Za-z0-9]"
)
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE|AUTH")
LONG_RUN = re.compile(r"[A-Za-z0-9]{20,}")
# a piece between , : = ; of a key's alphabet (base64, base64url, a JWT's dots)
PIECE = re.compile(r"[A-Za-z0-9+/_.-]{20,}")
CLASSES = (re.compile(r"[a-z]"), re.compile(r"[A-Z]"), re.compile(r"\d"))


def allowed_name(name: str) -> bool:
    """Whether ``name`` is on the allow-list.

    >>> [allowed_name(n) for n in ("NCCL_ALGO", "NCCL_NET_PLUGIN", "PYTHONPATH", "PYTORCH_CUDA_ALLOC_CONF")]
    [True, False, False, True]
    """
    if SECRET_NAME.search(name) or name in REFUSED_NAMES or REFUSED_PARTS.intersection(name.split("_")):
        return False
    return name in NAMED or name.startswith(PREFIXES)


def looks_secret(value: str) -> bool:
    """Whether ``value`` looks like a credential: a token's known prefix (``ghp_``, ``hf_``, ``AKIA``, a JWT's
    ``eyJ``...), 20 or more letters and digits in a row holding both, or as many of a key's alphabet (base64 with ``+``,
    base64url, a JWT) holding lower case, upper case and digits, or 32 letters in a row of both cases
    (``expandable_segments`` and ``mlx5_0`` are none of these; a hex, base62 or base64 key is).

    >>> looks_secret("hf_" + "a1" * 17), looks_secret("expandable_segments:True"), looks_secret("^docker0,lo")
    (True, False, False)
    >>> looks_secret("wJalrXUtnFEMI+K7MDENG+bPxRfiCYEXAMPLEKEY"), looks_secret("max_split_size_mb:128")
    (True, False)
    """
    if SECRET_SHAPES.search(value):
        return True
    if any(re.search(r"\d", run) and re.search(r"[A-Za-z]", run) for run in LONG_RUN.findall(value)):
        return True
    for piece in PIECE.findall(value):
        classes = sum(1 for pattern in CLASSES if pattern.search(piece))
        if classes == 3 or (classes == 2 and re.search(r"[A-Za-z]{32}", piece)):
            return True
    return False


def allowed_names() -> str:
    """The allow-list in words (for errors and docs)."""
    prefixes = ", ".join(prefix + "*" for prefix in PREFIXES)
    return f"{prefixes} and the allocator's: PYTORCH_CUDA_ALLOC_CONF, CUDA_DEVICE_MAX_CONNECTIONS, ..."


def check_variable(name: str, value: str) -> None:
    """Refuse a launch variable outside the allow-list or with a value out of bounds: a :class:`WorkloadError` at
    ``launch-var`` naming the variable (see the module docstring)."""
    if not allowed_name(name):
        raise WorkloadError("launch-var", f"{name!r} is not a variable a launch may set (allowed: {allowed_names()})")
    if len(value) > MAX_VALUE or not VALUE.fullmatch(value):
        raise WorkloadError(
            "launch-var",
            f"{name}: a value is at most {MAX_VALUE} letters, digits and _ . , : = + ^ - (no path, no shell character)",
        )
    if looks_secret(value):
        raise WorkloadError("launch-var", f"{name}: the value looks like a credential; secrets are no launch setting")
    if THREAD_NAMES.fullmatch(name) and (not value.isdigit() or not 1 <= int(value) <= MAX_THREADS):
        raise WorkloadError("launch-var", f"{name} must be an integer from 1 to {MAX_THREADS}, got {value!r}")
    for number in re.findall(r"\d+", value):
        if int(number) > MAX_NUMBER:
            raise WorkloadError("launch-var", f"{name}: {number} is above {MAX_NUMBER}")


__all__ = ["MAX_THREADS", "allowed_name", "allowed_names", "check_variable", "looks_secret"]
