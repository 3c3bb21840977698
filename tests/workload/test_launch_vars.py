"""The launch variables' allow-list (tuner.workload.launch_vars): documented names only, each family's documented
value syntax, no credential by name or by shape, and a launch environment that was never checked (unpickled)
checked again before any rank is planned."""

from __future__ import annotations

import pickle
import shlex

import pytest

from tuner.workload import LaunchEnv
from tuner.workload.errors import WorkloadError
from tuner.workload.launch_names import ALLOWED, LEFT_OUT
from tuner.workload.launch_vars import REFUSED_PARTS, check_variable, looks_secret

DOCUMENTED_VALUES = [
    ("OMP_PLACES", "{0:4}:2:4"),  # OpenMP 5.2, 6.5: a place list with length and stride
    ("OMP_PLACES", "cores(4)"),
    ("OMP_PLACES", "!{0},{1:3}"),
    ("OMP_PROC_BIND", "spread,close"),
    ("GOMP_CPU_AFFINITY", "0 3 1-2 4-15:2"),  # libgomp's manual
    ("KMP_AFFINITY", "granularity=fine,proclist=[0,{1,2},3],explicit"),  # the Intel OpenMP runtime's
    ("KMP_HW_SUBSET", "1s@1,4c,1t"),
    ("NCCL_ALGO", "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring"),  # NCCL 2.24+ env.rst
    ("NCCL_ALGO", "allreduce:^tree"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"),
    ("GLOO_SOCKET_IFNAME", "eth0"),
    ("GLOO_DEVICE_TRANSPORT", "TCP"),
    ("MALLOC_ARENA_MAX", "2"),  # glibc's mallopt(3)
    ("MALLOC_TRIM_THRESHOLD_", "131072"),
    ("GLIBC_TUNABLES", "glibc.malloc.arena_max=4:glibc.malloc.trim_threshold=131072"),
    ("MALLOC_CONF", "background_thread:true,dirty_decay_ms:30000,narenas:4"),  # jemalloc
    ("TCMALLOC_RELEASE_RATE", "10"),
    ("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
    ("TORCH_NCCL_HIGH_PRIORITY", "1"),
    ("MKL_THREADING_LAYER", "SEQUENTIAL"),
]


@pytest.mark.parametrize(("name", "value"), DOCUMENTED_VALUES)
def test_a_documented_setting_in_its_documented_syntax_is_allowed(name: str, value: str) -> None:
    assert LaunchEnv.of(variables={name: value}).overrides == {name: value}


REFUSED = [
    ("NCCL_NETPLUGIN", "x"),  # no library documents it: not on the list, whatever its prefix
    ("NCCL_KEY", "hunter2"),
    ("OMP_", "1"),
    ("KMP_LIBRARY_PATH", "x"),
    ("NCCL_GIN_PLUGIN", "x"),
    ("NCCL_RMA_PLUGIN", "x"),
    ("NCCL_IBVERBS_LIB", "x"),
    ("NCCL_GRAPH_FILE", "x"),
    ("OMP_TOOL", "enabled"),
    ("KMP_CPUINFO_FILE", "x"),
    ("MALLOC_TRACE", "x"),  # glibc's mtrace writes the file it names
    ("LD_BIND_NOW", "1"),
    ("PYTHONINSPECT", "1"),
    ("PYTHONWARNINGS", "error"),
    ("HOME", "x"),
    ("IFS", "x"),
    ("PS4", "x"),
    ("PROMPT_COMMAND", "x"),
    ("NODE_OPTIONS", "x"),
    ("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX2"),  # only glibc.malloc.* entries
    ("MALLOC_CONF", "prof:true,prof_prefix:jeprof"),  # jemalloc's profiling writes files
    ("GOMP_CPU_AFFINITY", "0-3\n4-7"),
    ("OMP_PLACES", "{0:4}/x"),
    ("NCCL_SOCKET_IFNAME", "eth0 lo"),  # a space only where the syntax has one
    ("NCCL_ALGO", "Ring;touch x"),
    ("NCCL_ALGO", "ring$(id)"),
    ("KMP_AFFINITY", "`id`"),
]


@pytest.mark.parametrize(("name", "value"), REFUSED)
def test_what_no_library_documents_or_what_runs_code_is_refused_naming_it(name: str, value: str) -> None:
    with pytest.raises(WorkloadError) as error:
        LaunchEnv.of(variables={name: value})
    assert error.value.field == "launch-var" and name in str(error.value)


CREDENTIALS = [
    "qzmvtkwphdjrxnbyfslcga",  # random lower-case letters: no setting's word is 16 letters long
    "JBSWY3DPEHPK3PXPJBSW",  # a base32 one-time-password seed
    "8f14e45f-ceea-467a-9f4a-8e2b7b6e1d3c",  # a UUID, as Heroku's API keys are
    "ab12-cd34-ef56-gh78-ij90",  # a licence key's dashed groups
    "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",  # SendGrid
    "shpat_0123456789abcdef0123456789abcdef",  # Shopify
    "dop_v1_" + "ab12" * 16,  # DigitalOcean
    "xapp-1-A0123456789-0123456789012-abcdef",  # Slack app
    "AAAAB3NzaC1yc2EAAAADAQABAAABAQ",  # an ssh public key's body
    "dGhpcyBpcyBhIHNlY3JldA==",  # base64
]


@pytest.mark.parametrize("value", CREDENTIALS)
def test_a_credential_shaped_value_is_refused_without_being_quoted(value: str) -> None:
    with pytest.raises(WorkloadError) as error:
        LaunchEnv.of(variables={"NCCL_SOCKET_IFNAME": value})
    assert "NCCL_SOCKET_IFNAME" in str(error.value) and value not in str(error.value)


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "NCCL_AUTH_SECRET", "GITHUB_PAT_TOKEN"])
def test_a_credential_name_is_refused_as_one(name: str) -> None:
    with pytest.raises(WorkloadError, match="names a credential"):
        check_variable(name, "x")


def test_the_settings_values_read_as_settings_not_secrets() -> None:
    """Every documented value above, and the allocator's long option names, are not taken for credentials."""
    for _, value in DOCUMENTED_VALUES:
        assert not looks_secret(value), value
    assert not looks_secret("garbage_collection_threshold:0.8,pinned_use_cuda_host_register:True")


def test_the_list_holds_no_plug_in_file_or_address_name() -> None:
    """The guard over the list: no allowed name holds a part that loads code or names a file."""
    assert not {name for name in ALLOWED if REFUSED_PARTS.intersection(name.split("_"))}
    assert not ALLOWED & LEFT_OUT
    assert not [name for name in ALLOWED if name.startswith(("LD_", "PYTHON", "BASH", "PATH"))]


def test_the_printed_command_quotes_a_value_a_shell_would_split() -> None:
    from tuner.workload import launch_command

    launch = LaunchEnv.of(variables={"GOMP_CPU_AFFINITY": "0-3 8-11", "NCCL_ALGO": "allreduce:tree;broadcast:ring"})
    command = launch_command(launch, 2, 1, None)
    words = shlex.split(command)
    assert words[:2] == ["GOMP_CPU_AFFINITY=0-3 8-11", "NCCL_ALGO=allreduce:tree;broadcast:ring"], command


def test_an_unchecked_launch_environment_is_checked_before_any_rank_is_planned() -> None:
    """Unpickling makes an object without running its checks: the launcher's
    planning checks it again, so a stray LD_PRELOAD never reaches a rank's environment or a fork server's key."""
    from tuner.measure.driver.launch_env import plan_rank
    from tuner.measure.driver.places import RankPlace

    unchecked = object.__new__(LaunchEnv)
    for field, value in (("launcher", "deepspeed"), ("bind_cores", False), ("variables", (("LD_PRELOAD", "x.so"),))):
        object.__setattr__(unchecked, field, value)
    received = pickle.loads(pickle.dumps(unchecked))
    assert received.overrides == {"LD_PRELOAD": "x.so"}  # unpickled without a check
    with pytest.raises(WorkloadError, match="LD_PRELOAD"):
        plan_rank(received, RankPlace(0, 1, 0, 1), 1, {}, cores=2)
