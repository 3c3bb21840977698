"""Which variables a launch may set for its ranks (:func:`check_variable`): an allow-list of what launchers and their
users set for speed (:data:`tuner.workload.launch_names.ALLOWED`), with bounded values. Pure.

A launch variable reaches every rank of every measured run, on the worker that runs a queued job too, so it must not
be able to run code or read or write files there: a name is allowed only where a library documents it as a setting
of threads and binding (``OMP_*``, ``GOMP_*``, ``KMP_*``, ``MKL_*``, ``OPENBLAS_*``), collectives (``NCCL_*``,
``TORCH_NCCL_*``, ``GLOO_*``), an allocator (``PYTORCH_CUDA_ALLOC_CONF``, glibc's ``MALLOC_*_``, jemalloc's
``MALLOC_CONF``, ``TCMALLOC_*``) or the device queue (``CUDA_DEVICE_MAX_CONNECTIONS``...); the loader's (``LD_*``),
Python's (``PYTHON*``), search paths, shell start-up files (``BASH_ENV``, ``ENV``), plug-ins and file names are
never on it, and no name holding one of :data:`REFUSED_PARTS` is. A value is at most :data:`MAX_VALUE` characters of
:data:`VALUE` (letters, digits and ``_ . , : = + ^ -``), plus the few a variable's documented syntax needs
(:data:`EXTRA`: ``OMP_PLACES={0:4}:2``, ``GOMP_CPU_AFFINITY=0-3 8-11``, ``NCCL_ALGO=allreduce:tree;broadcast:ring``);
never ``/``, a quote, ``$``, a backslash or a control character (no path, nothing a shell would expand); a thread
count at most :data:`MAX_THREADS`, any other number at most :data:`MAX_NUMBER`; ``GLIBC_TUNABLES`` only
``glibc.malloc.*`` entries and ``MALLOC_CONF`` no profiling (it writes files); and nothing that looks like a
credential (:func:`looks_secret`): secrets are no launch setting and would be shown with the run.

Example:
    >>> check_variable("OMP_NUM_THREADS", "4")
    >>> check_variable("LD_PRELOAD", "x.so")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tuner.workload.errors.WorkloadError: launch-var: 'LD_PRELOAD' is not a variable a launch may set (allowed: ...)
"""

from __future__ import annotations

import re
import string

from tuner.workload.errors import WorkloadError
from tuner.workload.launch_names import ALLOWED

# words of a name (split at _) that load code, name a file or a folder, reach a library or another host: refused
# whatever the list says (a guard over it)
REFUSED_PARTS = frozenset(
    {"PLUGIN", "FILE", "PATH", "DIR", "LIB", "LIBRARY", "LIBRARIES", "TOOL", "TOOLS", "PRELOAD", "DUMP", "SO"}
)
VALUE = frozenset(string.ascii_letters + string.digits + "_.,:=+^-")
# what a variable's documented syntax adds: OpenMP place lists and exclusions, libgomp's CPU lists, the Intel
# runtime's proclists and subsets, the CUDA allocator's per-size divisions, NCCL's per-collective selections
EXTRA = {
    "OMP_PLACES": "{}()!",
    "GOMP_CPU_AFFINITY": " ",
    "KMP_AFFINITY": "[]{}",
    "KMP_HW_SUBSET": "@",
    "PYTORCH_CUDA_ALLOC_CONF": "[]>",
    "PYTORCH_ALLOC_CONF": "[]>",
    "PYTORCH_HIP_ALLOC_CONF": "[]>",
    "NCCL_ALGO": ";",
    "NCCL_PROTO": ";",
}
MAX_VALUE = 256
MAX_THREADS = 1024  # threads per rank: several times the cores of the largest nodes
MAX_NUMBER = 2**40  # any other number (NCCL_BUFFSIZE bytes, timeouts): beyond it a typo, or an overflow
THREAD_NAMES = re.compile(r".*(NUM_THREADS|THREAD_LIMIT|NTHREADS|MAX_CONNECTIONS|NCHANNELS)")
MALLOC_TUNABLE = re.compile(r"glibc\.malloc\.[a-z_]+=\d+")
# what API tokens look like: a known prefix, or a long run of letters and digits mixed
SECRET_SHAPES = re.compile(
    r"(?:hf_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|sk-|sk_live_|sk_test_|rk_live_|xox[abprs]-|xapp-|AKIA|ASIA|glpat-|"
    r"glsa_|ya29\.|AIza|npm_|pypi-|dapi|eyJ|SG\.|shp(?:at|ss|ca|pa)_|do[opr]_v1_|sq0(?:atp|csp)-|AAAA[BC]3Nza)"
    r"[A-Za-z0-9]"
)
# a UUID (Heroku's and many services' keys) or a licence key's dashed groups of letters and digits
GROUPED = re.compile(r"(?:[A-Za-z0-9]{4,8}-){3,}[A-Za-z0-9]{4,12}")
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE|AUTH")
LONG_RUN = re.compile(r"[A-Za-z0-9]{16,}")
# a piece between , : = ; of a key's alphabet (base64, base64url, a JWT's dots)
PIECE = re.compile(r"[A-Za-z0-9+/_.-]{20,}")
CLASSES = (re.compile(r"[a-z]"), re.compile(r"[A-Z]"), re.compile(r"\d"))


def allowed_name(name: str) -> bool:
    """Whether ``name`` is on the allow-list.

    >>> [allowed_name(n) for n in ("NCCL_ALGO", "NCCL_NET_PLUGIN", "PYTHONPATH", "GLOO_SOCKET_IFNAME", "NCCL_KEY")]
    [True, False, False, True, False]
    """
    return name in ALLOWED and not SECRET_NAME.search(name) and not REFUSED_PARTS.intersection(name.split("_"))


def _random_run(run: str) -> bool:
    """Whether a run of 16 or more letters and digits reads as a key: any that is not a number (no documented
    setting's value holds a word that long: ``SEQUENTIAL``, ``CollnetDirect``, ``granularity``; numbers are bounded
    by :data:`MAX_NUMBER`)."""
    return not run.isdigit()


def _mixed(text: str) -> bool:
    """Whether ``text`` holds both letters and digits."""
    return bool(re.search(r"\d", text) and re.search(r"[A-Za-z]", text))


def token_shaped(text: str) -> bool:
    """Whether ``text`` holds a token in a shape no ordinary word has: a token's known prefix (``ghp_``, ``hf_``,
    ``AKIA``, a JWT's ``eyJ``...), 20 or more letters and digits in a row holding both, or 20 or more of a key's
    alphabet (base64 with ``+``, base64url, a JWT) holding lower case, upper case and digits, or 32 letters in a row
    of both cases. Error messages are read through it too (``OutOfMemoryError`` is none of these).

    >>> token_shaped("ghp_" + "Ab3" * 12), token_shaped("OutOfMemoryError"), token_shaped("ncclUnhandledCudaError")
    (True, False, False)
    """
    if SECRET_SHAPES.search(text):
        return True
    if any(_mixed(run) for run in re.findall(r"[A-Za-z0-9]{20,}", text)):
        return True
    for piece in PIECE.findall(text):
        classes = sum(1 for pattern in CLASSES if pattern.search(piece))
        if classes == 3 or (classes == 2 and re.search(r"[A-Za-z]{32}", piece)):
            return True
    return False


def looks_secret(value: str) -> bool:
    """Whether a setting's ``value`` looks like a credential: :func:`token_shaped`, 16 letters and digits in a row
    (:func:`_random_run`), or a UUID or dashed groups of letters and digits (a licence key). ``expandable_segments``
    and ``mlx5_0`` are none of these; a hex, base62 or base64 key is.

    >>> looks_secret("hf_" + "a1" * 17), looks_secret("expandable_segments:True"), looks_secret("^docker0,lo")
    (True, False, False)
    >>> looks_secret("wJalrXUtnFEMI+K7MDENG+bPxRfiCYEXAMPLEKEY"), looks_secret("max_split_size_mb:128")
    (True, False)
    >>> looks_secret("qzmvtkwphdjrxnbyfslc"), looks_secret("ring,collnetdirect;allreduce:tree")
    (True, False)
    """
    if token_shaped(value) or any(_mixed(group) for group in GROUPED.findall(value)):
        return True
    return any(_random_run(run) for run in LONG_RUN.findall(value))


def allowed_names() -> str:
    """The allow-list in words (for errors and docs)."""
    return (
        "the documented names of OMP_*, GOMP_*, KMP_*, MKL_*, OPENBLAS_*, NCCL_*, TORCH_NCCL_*, GLOO_*, "
        "PYTORCH_CUDA_ALLOC_CONF, MALLOC_*, TCMALLOC_*, CUDA_DEVICE_MAX_CONNECTIONS, ... (docs/launch_env.md)"
    )


def _check_syntax(name: str, value: str) -> None:
    """Refuse a value outside its variable's characters, or a structured value holding what is not a setting."""
    if len(value) > MAX_VALUE or not set(value) <= VALUE.union(EXTRA.get(name, "")):
        extra = " ".join(EXTRA.get(name, ""))
        raise WorkloadError(
            "launch-var",
            f"{name}: a value is at most {MAX_VALUE} letters, digits and _ . , : = + ^ - {extra}"
            " (no path, no shell character)",
        )
    if name == "GLIBC_TUNABLES" and not all(MALLOC_TUNABLE.fullmatch(item) for item in value.split(":")):
        raise WorkloadError("launch-var", f"{name}: only glibc.malloc.NAME=NUMBER entries, separated by ':'")
    if name == "MALLOC_CONF" and any(item.strip().startswith("prof") for item in value.split(",")):
        raise WorkloadError("launch-var", f"{name}: jemalloc's profiling options write files: not a launch setting")


def check_variable(name: str, value: str) -> None:
    """Refuse a launch variable outside the allow-list or with a value out of bounds: a :class:`WorkloadError` at
    ``launch-var`` naming the variable, never quoting a value that may be a secret (see the module docstring)."""
    if SECRET_NAME.search(name):
        raise WorkloadError("launch-var", f"{name!r} names a credential: secrets are no launch setting")
    if not allowed_name(name):
        raise WorkloadError("launch-var", f"{name!r} is not a variable a launch may set (allowed: {allowed_names()})")
    _check_syntax(name, value)
    if looks_secret(value):
        raise WorkloadError("launch-var", f"{name}: the value looks like a credential; secrets are no launch setting")
    if THREAD_NAMES.fullmatch(name) and (not value.isdigit() or not 1 <= int(value) <= MAX_THREADS):
        raise WorkloadError("launch-var", f"{name} must be an integer from 1 to {MAX_THREADS}, got {value!r}")
    for number in re.findall(r"\d+", value):
        if int(number) > MAX_NUMBER:
            raise WorkloadError("launch-var", f"{name}: {number} is above {MAX_NUMBER}")


__all__ = ["MAX_THREADS", "allowed_name", "allowed_names", "check_variable", "looks_secret", "token_shaped"]
