"""Launch variables against the allow-list, as rows of ``bench/faults.py``: many names and values a hostile job could
carry (loader, interpreter, shell start-up, plug-in and file names, names no library documents, credential names
and shapes) and the documented settings in their documented syntax, through the API; and jobs stored directly
whose variables point at code that writes a marker when it runs, taken by ``dstune worker --once``. Real
components: the API app (FastAPI's client in this process), the worker as a subprocess; the truth of "no code ran"
is the file system (a marker each payload writes when it runs)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from security import AUTH, DSTUNE, WORK, _client, _outcome

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "tests" / room) for room in ("worker", "storage")]
from test_public_error import HIDDEN as HIDDEN_ERRORS  # noqa: E402  (tests/storage/test_public_error.py)

LOADER = ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "LD_BIND_NOW", "LD_DEBUG_OUTPUT", "GCONV_PATH", "LOCPATH",
          "HOSTALIASES", "RESOLV_HOST_CONF", "TZDIR", "MALLOC_TRACE", "GLIBC_TUNABLES"]  # fmt: skip
INTERPRETER = ["PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT", "PYTHONWARNINGS",
               "PYTHONBREAKPOINT", "PYTHONPYCACHEPREFIX", "PYTHONSAFEPATH", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR",
               "NODE_OPTIONS", "PERL5OPT", "RUBYOPT", "JAVA_TOOL_OPTIONS"]  # fmt: skip
SHELL = ["BASH_ENV", "ENV", "PATH", "HOME", "IFS", "PS4", "PROMPT_COMMAND", "SHELLOPTS", "CDPATH", "ZDOTDIR",
         "TMPDIR", "XDG_CONFIG_HOME", "EDITOR"]  # fmt: skip
PLUGINS = ["NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "NCCL_GIN_PLUGIN",
           "NCCL_RMA_PLUGIN", "NCCL_IBVERBS_LIB", "NCCL_CONF_FILE", "NCCL_DEBUG_FILE", "NCCL_TOPO_FILE",
           "NCCL_TOPO_DUMP_FILE", "NCCL_GRAPH_FILE", "NCCL_GRAPH_DUMP_FILE", "NCCL_COMM_ID", "NCCL_RAS_ADDR",
           "OMP_TOOL", "OMP_TOOL_LIBRARIES", "OMP_TOOL_VERBOSE_INIT", "KMP_CPUINFO_FILE", "MKL_VERBOSE_OUTPUT_FILE",
           "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_EXTENSIONS_DIR",
           "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "CUDA_INJECTION64_PATH", "NVIDIA_TF32_OVERRIDE_FILE"]  # fmt: skip
INVENTED = ["NCCL_NETPLUGIN", "NCCL_PLUGINS", "OMP_", "NCCL_", "KMP_LIBRARY_PATH", "MKL_EXTRA", "GLOO_PLUGIN",
            "MALLOC_", "TCMALLOC_", "CUDA_", "PYTORCH_", "ld_preload", "Omp_Num_Threads",
            "\u039fMP_NUM_THREADS"]  # fmt: skip
CREDENTIAL_NAMES = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY",
                    "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "OPENAI_API_KEY", "NCCL_AUTH_SECRET", "DB_PASSWORD",
                    "GOOGLE_APPLICATION_CREDENTIALS"]  # fmt: skip
CREDENTIAL_VALUES = ["hf_" + "aB3" * 12, "ghp_" + "Ab3" * 12, "github_pat_11ABCDEFG0123456789_abcdef",
                     "sk-proj-" + "Ab1" * 16, "sk-ant-api03-" + "x" * 40, "AKIAIOSFODNN7EXAMPLE",
                     "wJalrXUtnFEMI+K7MDENG+bPxRfiCYEXAMPLEKEY", "xoxb-1234567890-abcdefghij",
                     "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", "ya29.a0AfH6SMBx-abcdefGHIJKL",
                     "AIzaSyA-1234567890abcdefghijklmnopqrstu", "glpat-xxxxxxxxxxxxxxxxxxxx",
                     "npm_abcdefghijklmnopqrstuvwxyzABCDEF0123", "pypi-AgEIcHlwaS5vcmcCJGFiY2Rl",
                     "SG.ngeVfQFYQlKU0ufo8x5d1A.TwL2iGABf9DHoTf", "shpat_0123456789abcdef0123456789abcdef",
                     "dop_v1_" + "ab12" * 16, "8f14e45f-ceea-467a-9f4a-8e2b7b6e1d3c", "ab12-cd34-ef56-gh78-ij90",
                     "d41d8cd98f00b204e9800998ecf8427e", "qzmvtkwphdjrxnbyfslcga", "JBSWY3DPEHPK3PXPJBSW",
                     "dGhpcyBpcyBhIHNlY3JldA==", "AAAAB3NzaC1yc2EAAAADAQABAAABAQ"]  # fmt: skip
BAD_VALUES = {"NCCL_SOCKET_IFNAME": "/etc/passwd", "NCCL_ALGO": "ring$(id)", "KMP_AFFINITY": "`id`",
              "GOMP_CPU_AFFINITY": "0-3\n4-7", "OMP_NUM_THREADS": "99999999999", "MKL_NUM_THREADS": "0",
              "NCCL_BUFFSIZE": "9" * 30, "OMP_PLACES": "{0:4}/x", "NCCL_PROTO": "x" * 300,
              "MALLOC_CONF": "prof:true,prof_prefix:jeprof", "PYTORCH_CUDA_ALLOC_CONF": "a'b",
              "NCCL_IB_HCA": "mlx5_0\x00"}  # fmt: skip
DOCUMENTED = {"OMP_NUM_THREADS": "4", "OMP_PLACES": "{0:4}:2:4", "OMP_PROC_BIND": "spread,close",
              "GOMP_CPU_AFFINITY": "0 3 1-2 4-15:2", "KMP_AFFINITY": "granularity=fine,proclist=[0,{1,2},3],explicit",
              "KMP_HW_SUBSET": "1s@1,4c,1t", "KMP_BLOCKTIME": "0", "MKL_NUM_THREADS": "8",
              "NCCL_ALGO": "ring,collnetdirect;allreduce:tree;broadcast:ring", "NCCL_PROTO": "^LL128",
              "NCCL_SOCKET_IFNAME": "^docker0,lo", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
              "NCCL_DEBUG_SUBSYS": "INIT,COLL",
              "NCCL_P2P_LEVEL": "NVL", "NCCL_NCHANNELS_PER_NET_PEER": "2", "TORCH_NCCL_HIGH_PRIORITY": "1",
              "GLOO_SOCKET_IFNAME": "eth0", "GLOO_DEVICE_TRANSPORT": "TCP",
              "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,roundup_power2_divisions:[256:1,512:2,>:8]",
              "MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "131072",
              "GLIBC_TUNABLES": "glibc.malloc.arena_max=4:glibc.malloc.trim_threshold=131072",
              "MALLOC_CONF": "background_thread:true,dirty_decay_ms:30000", "TCMALLOC_RELEASE_RATE": "10",
              "CUDA_DEVICE_MAX_CONNECTIONS": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
              "MKL_THREADING_LAYER": "SEQUENTIAL"}  # fmt: skip
STORED = ["PYTHONPATH", "PYTHONSTARTUP", "BASH_ENV", "LD_PRELOAD"]


def _post(client: Any, variables: dict[str, str]) -> Any:
    return client.post("/v1/jobs", json={"workload": {**WORK, "launch": {"variables": variables}}}, headers=AUTH)


def _shown(client: Any, job: int, value: str) -> bool:
    """Whether a reader without the token sees the job's variables: a ``variables`` object, or the value itself where
    it is long enough to be told from other text."""
    launch = client.get(f"/v1/jobs/{job}").json()["request"]["workload"].get("launch", {})
    texts = [client.get(path).text for path in ("/v1/jobs", f"/v1/jobs/{job}")]
    return "variables" in launch or (len(value) >= 6 and any(value in text for text in texts))


def names_and_values() -> Any:
    """Every hostile name and value refused 422 naming the variable (a credential never quoted); every documented
    setting accepted; and none of the accepted values shown to a reader without the token."""
    hostile = [(name, "1") for name in LOADER + INTERPRETER + SHELL + PLUGINS + INVENTED + CREDENTIAL_NAMES]
    hostile += [("NCCL_SOCKET_IFNAME", value) for value in CREDENTIAL_VALUES] + list(BAD_VALUES.items())
    refused = quoted = accepted = shown = 0
    with _client() as client:
        for name, value in hostile:
            answer = _post(client, {name: value})
            message = answer.json()["detail"][0]["msg"] if answer.status_code == 422 else ""
            refused += answer.status_code == 422 and name in message
            quoted += value in CREDENTIAL_VALUES and value in message
        for name, value in DOCUMENTED.items():
            answer = _post(client, {name: value})
            accepted += answer.status_code == 201
            if answer.status_code == 201:
                shown += _shown(client, answer.json()["id"], value)
    ok = refused == len(hostile) and quoted == 0 and accepted == len(DOCUMENTED) and shown == 0
    return _outcome(
        recovered=ok,
        note=f"{refused}/{len(hostile)} hostile refused 422 naming the variable ({quoted} quoting a value); "
        f"{accepted}/{len(DOCUMENTED)} documented settings accepted; shown without token: {shown}",
    )


def stored_code() -> Any:
    """Jobs stored directly (as an older dstune kept them) whose PYTHONPATH, PYTHONSTARTUP, BASH_ENV and LD_PRELOAD
    point at code writing a marker: ``dstune worker --once`` fails each with the reason; no marker is written."""
    from test_no_code_through_a_job import _payloads

    from tuner.storage import Store

    folder = Path(tempfile.mkdtemp())
    variables, marks = _payloads(folder)
    url = f"sqlite:///{folder / 'jobs.db'}"
    store = Store.open(url)
    jobs = {
        name: store.enqueue_job(f"old-{i}", {"workload": {**WORK, "launch": {"variables": {name: variables[name]}}}})
        for i, name in enumerate(name for name in STORED if name in variables)
    }
    subprocess.run([DSTUNE, "worker", "--once", "--storage", url], capture_output=True, timeout=600, cwd=folder)
    failed = 0
    for name, job in jobs.items():
        record = store.get_job(job.id)
        failed += record is not None and record.status == "failed" and name in (record.error or "")
    ran = [mark.name for mark in marks if mark.exists()]
    return _outcome(
        recovered=failed == len(jobs) and not ran,
        note=f"{failed}/{len(jobs)} failed with the reason, unrun; markers written: {len(ran)}",
    )


# stored errors and what of each a reader without the token must not see: the public-error test's, and more
ERRORS = [*HIDDEN_ERRORS,
    ("CalledProcessError: Command '['/usr/bin/python', 'train.py', '--token', 'abc']' returned 1",
     ["train.py", "'abc'"]),
    ("Task was killed due to the node running low on memory.\nPID\tMEM\tCOMMAND\n42\t7.7\tpython other.py --key k",
     ["other.py", "--key k"]),
    ("OSError: [Errno 28] No space left on device: '/srv/dstune/profiles/x.json'", ["/srv/dstune"]),
    ('Traceback (most recent call last):\n  File "/home/alice/x.py", line 1\nRuntimeError: bad', ["/home/alice"]),
]  # fmt: skip


def stored_errors() -> Any:
    """Jobs failed with errors holding commands, credentials and paths: what GET /v1/jobs and /v1/jobs/{id} show a
    reader without the token holds none of them (the token's reader sees each whole)."""
    shown = whole = 0
    with _client() as client:
        store = client.app.state.store
        for text, secrets in ERRORS:
            job = _post(client, {}).json()["id"]
            store.finish_job(job, "failed", text)
            listed = [entry for entry in client.get("/v1/jobs").json() if entry["id"] == job]
            answers = [json.dumps(listed), client.get(f"/v1/jobs/{job}").text]
            shown += any(secret in answer for secret in secrets for answer in answers)
            whole += client.get(f"/v1/jobs/{job}", headers=AUTH).json()["error"] == text
    return _outcome(
        recovered=shown == 0 and whole == len(ERRORS),
        note=f"{len(ERRORS)} stored errors: {shown} showing a command, credential or path without the token; "
        f"{whole} whole with it",
    )


def rows() -> list[tuple[str, str, bool, Any]]:
    """(name, criterion, needs DeepSpeed, injection) for bench/faults.py's matrix."""
    return [
        ("launch variables, hostile and documented (API)", "hostile 422, documented 201, none shown", False,
         names_and_values),
        ("code in a stored job's variables (worker)", "failed unrun, no marker", False, stored_code),
        ("stored errors before an open reader (API)", "no command, credential, path", False, stored_errors),
    ]  # fmt: skip
