"""Each launcher's rules for a rank's threads, cores and variables (pure: the sources are quoted in
tuner/workload/launch_env.py), and the launch environment's place in the workload."""

from __future__ import annotations

import pytest

from tuner.workload import (
    ClusterSpec,
    LaunchEnv,
    Workload,
    WorkloadError,
    model_from_param_count,
    rank_env,
    workload_from_dict,
    workload_to_dict,
)


def env_of(launch: LaunchEnv, cores: int = 16, local: int = 4, rank: int = 0, nodes: int = 1, **inherited: str):
    return rank_env(
        launch, physical_cores=cores, local_world_size=local, local_rank=rank, inherited=inherited, nodes=nodes
    )


def test_deepspeed_leaves_torch_its_default_of_every_physical_core() -> None:
    env = env_of(LaunchEnv())
    assert (env.threads, env.cores, env.variables["OMP_NUM_THREADS"]) == (16, (), "16")
    assert "physical core" in env.rule


def test_deepspeed_passes_the_users_own_threads() -> None:
    assert env_of(LaunchEnv(), OMP_NUM_THREADS="3").threads == 3
    assert env_of(LaunchEnv(), OMP_NUM_THREADS="junk").threads == 16  # OpenMP ignores it: torch's default


def test_deepspeed_bind_cores_splits_the_physical_cores_among_local_ranks() -> None:
    """deepspeed/utils/numa.py:119-121: cores // local ranks each, rank r on slice r; OMP_NUM_THREADS the slice."""
    slices = [env_of(LaunchEnv(bind_cores=True), cores=10, local=4, rank=r) for r in range(4)]
    assert [env.cores for env in slices] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert {env.threads for env in slices} == {2}
    assert env_of(LaunchEnv(bind_cores=True), cores=2, local=4).threads == 1  # at least one core each
    assert env_of(LaunchEnv(bind_cores=True), OMP_NUM_THREADS="8").threads == 4  # the launcher sets it over the user's


def test_torchrun_sets_one_thread_only_with_several_local_processes() -> None:
    assert env_of(LaunchEnv("torchrun"), local=2).threads == 1
    assert env_of(LaunchEnv("torchrun"), local=1).threads == 16
    assert env_of(LaunchEnv("torchrun"), local=2, OMP_NUM_THREADS="5").threads == 5


def test_accelerate_runs_torchrun_on_one_machine_and_deepspeed_on_several() -> None:
    assert env_of(LaunchEnv("accelerate"), local=2, nodes=1).threads == 1
    assert env_of(LaunchEnv("accelerate"), local=2, nodes=2).threads == 16


def test_overrides_win_per_variable_and_speed_variables_pass_through() -> None:
    launch = LaunchEnv.of("torchrun", variables={"OMP_NUM_THREADS": "4", "NCCL_ALGO": "Ring"})
    env = env_of(launch, NCCL_IB_DISABLE="1", HOME="/root", CUDA_DEVICE_MAX_CONNECTIONS="1")
    assert env.threads == 4 and env.rule == "--launch-var OMP_NUM_THREADS"
    assert env.variables == {
        "OMP_NUM_THREADS": "4",
        "NCCL_ALGO": "Ring",
        "NCCL_IB_DISABLE": "1",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    }


@pytest.mark.parametrize(
    ("launch", "field"),
    [
        ({"launcher": "mpirun"}, "launcher-env"),
        ({"variables": {"RANK": "1"}}, "launch-var"),
        ({"variables": {"DSTUNE_STORAGE": "x"}}, "launch-var"),
        ({"variables": {"lower": "x"}}, "launch-var"),
        ({"variables": {"OMP_NUM_THREADS": "0"}}, "launch-var"),
        ({"threads": 2}, "launch"),
    ],
)
def test_bad_launch_names_its_field(launch: dict, field: str) -> None:
    with pytest.raises(WorkloadError) as error:
        LaunchEnv.from_dict(launch)
    assert error.value.field == field


def test_the_default_launch_keeps_fingerprints_and_another_changes_them() -> None:
    plain = Workload(model_from_param_count(1e9), ClusterSpec(gpus_per_node=2, device="cpu"))
    assert "launch" not in workload_to_dict(plain)
    torchrun = Workload(plain.model, plain.cluster, launch=LaunchEnv.of("torchrun", variables={"NCCL_ALGO": "Ring"}))
    assert torchrun.fingerprint() != plain.fingerprint()
    assert workload_from_dict(workload_to_dict(torchrun)) == torchrun
    reordered = LaunchEnv.of(variables={"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"})
    assert reordered == LaunchEnv.of(variables={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"})


def test_the_request_carries_the_launch_and_names_a_bad_variable_by_its_path() -> None:
    from tuner.requests import FieldError, WorkloadRequest, to_workload, validated

    body = {"params": 1e9, "gpus": 2, "launch": {"launcher": "torchrun", "variables": {"NCCL_ALGO": "Ring"}}}
    workload = to_workload(validated(WorkloadRequest, body))
    assert workload.launch == LaunchEnv.of("torchrun", variables={"NCCL_ALGO": "Ring"})
    with pytest.raises(FieldError) as error:
        to_workload(validated(WorkloadRequest, {**body, "launch": {"variables": {"LOCAL_RANK": "0"}}}))
    assert error.value.loc == ("launch", "variables")


def test_the_export_says_how_to_launch_what_was_measured() -> None:
    from tuner.cli.study_view import launch_notes

    workload = Workload(model_from_param_count(1e9), ClusterSpec(gpus_per_node=2, device="cpu"))
    record = {"launcher": "deepspeed", "threads_per_rank": [2, 2], "affinity_per_rank": [[0, 1], [0, 1]]}
    measured, crowded, command = launch_notes(workload, record, "best.json")
    assert measured.startswith("measured in: deepspeed launcher, threads per rank 2, 2")
    # 4 threads on 2 cores (the deepspeed launcher's default on a small machine): the export flags it
    assert crowded.startswith("oversubscribed: 2 ranks × 2 threads on 2 cores") and "--launcher-env torchrun" in crowded
    assert command == "launch it as measured: OMP_NUM_THREADS=2 deepspeed --num_gpus 2 train.py --deepspeed best.json"
    unmeasured = launch_notes(Workload(workload.model, workload.cluster, launch=LaunchEnv("torchrun")), None, "c.json")
    assert unmeasured == ["launch it as measured: torchrun --nproc_per_node 2 train.py --deepspeed c.json"]


def test_the_cli_refuses_a_bad_launch_variable_in_one_line() -> None:
    from typer.testing import CliRunner

    from tuner.cli.app import app

    result = CliRunner().invoke(app, ["estimate", "--params", "1e9", "--launch-var", "OMP_NUM_THREADS=0"])
    assert result.exit_code == 2
    assert "launch-var" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["estimate", "--params", "1e9", "--launch-var", "NOEQUALS"])
    assert result.exit_code == 2 and "launch-var" in result.output


def test_ray_reserves_each_ranks_threads_up_to_its_share_of_a_node() -> None:
    from tuner.measure.driver.launch_env import reserved_cpus

    assert reserved_cpus(LaunchEnv(), 2, 16, {}) == 8  # deepspeed's default wants 16 each: capped at the share
    assert reserved_cpus(LaunchEnv("torchrun"), 2, 16, {}) == 1
    assert reserved_cpus(LaunchEnv.of(variables={"OMP_NUM_THREADS": "4"}), 2, 16, {}) == 4  # an offload's CPU Adam
    assert reserved_cpus(LaunchEnv(bind_cores=True), 4, 2, {}) == 1


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LD_PRELOAD", "/tmp/x.so"),
        ("LD_LIBRARY_PATH", "x"),
        ("PYTHONPATH", "x"),
        ("PYTHONSTARTUP", "x"),
        ("PATH", "x"),
        ("GLIBC_TUNABLES", "x"),
        ("NCCL_NET_PLUGIN", "x"),
        ("NCCL_TUNER_PLUGIN", "x"),
        ("NCCL_PROFILER_PLUGIN", "x"),
        ("NCCL_ENV_PLUGIN", "x"),
        ("NCCL_DEBUG_FILE", "x"),
        ("NCCL_TOPO_FILE", "x"),
        ("OMP_TOOL_LIBRARIES", "x"),
        ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "x"),
        ("HF_TOKEN", "x"),
        ("WANDB_API_KEY", "x"),
        ("OMP_NUM_THREADS", "99999999999"),
        ("MKL_NUM_THREADS", "0"),
        ("NCCL_SOCKET_IFNAME", "/etc/passwd"),
        ("NCCL_ALGO", "Ring;touch x"),
        ("NCCL_ALGO", "x" * 257),
        ("NCCL_SOCKET_IFNAME", "hf_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("NCCL_IB_HCA", "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0"),
        ("NCCL_BUFFSIZE", "9" * 30),
        ("NCCL_COMM_ID", "203.0.113.9:4000"),
        ("NCCL_RAS_ADDR", "0.0.0.0:28028"),
        ("ld_preload", "x"),
        ("BASH_ENV", "x"),
        ("ENV", "x"),
        ("LD_AUDIT", "x"),
        ("GCONV_PATH", "x"),
        ("TORCH_EXTENSIONS_DIR", "x"),
        ("TRITON_CACHE_DIR", "x"),
        ("\u039fMP_NUM_THREADS", "4"),
        ("NCCL_ALGO", "wJalrXUtnFEMI+K7MDENG+bPxRfiCYEXAMPLEKEY"),
        ("NCCL_ALGO", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.abc"),
        ("NCCL_ALGO", "sk_live_abcdefghijklmnopqrstuvwx"),
        ("NCCL_ALGO", "ya29.a0AfH6SMBx-abcdefGHIJKLmnop"),
        ("NCCL_ALGO", "abcdefghijklmnopqrstuvwxyzABCDEF"),
    ],
)
def test_a_launch_variable_outside_the_allow_list_is_refused_naming_it(name: str, value: str) -> None:
    with pytest.raises(WorkloadError) as error:
        LaunchEnv.of(variables={name: value})
    assert error.value.field == "launch-var" and name in str(error.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OMP_NUM_THREADS", "4"),
        ("KMP_AFFINITY", "granularity=fine,compact,1,0"),
        ("GOMP_CPU_AFFINITY", "0-3,8-11"),
        ("MKL_NUM_THREADS", "8"),
        ("NCCL_SOCKET_IFNAME", "^docker0,lo"),
        ("NCCL_IB_HCA", "mlx5_0:1,mlx5_1:1"),
        ("NCCL_P2P_DIRECT_DISABLE", "1"),
        ("TORCH_NCCL_AVOID_RECORD_STREAMS", "1"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:128"),
        ("CUDA_DEVICE_MAX_CONNECTIONS", "1"),
        ("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6,roundup_power2_divisions:4"),
        ("NCCL_PROTO", "LL,LL128,Simple"),
        ("NCCL_DEBUG_SUBSYS", "INIT,COLL,P2P,NET"),
    ],
)
def test_what_launchers_set_for_speed_is_allowed(name: str, value: str) -> None:
    assert LaunchEnv.of(variables={name: value}).overrides == {name: value}


def test_the_api_refuses_a_loader_variable_with_422_naming_it() -> None:
    from tuner.requests import FieldError, WorkloadRequest, to_workload, validated

    body = {"params": 1e9, "gpus": 2, "launch": {"variables": {"LD_PRELOAD": "/tmp/evil.so"}}}
    with pytest.raises(FieldError) as error:
        to_workload(validated(WorkloadRequest, body))
    assert error.value.loc == ("launch", "variables") and "LD_PRELOAD" in error.value.message


def test_the_cli_refuses_a_loader_variable_and_says_the_shell_reaches_the_ranks() -> None:
    from typer.testing import CliRunner

    from tuner.cli.app import app

    result = CliRunner().invoke(app, ["estimate", "--params", "1e9", "--launch-var", "PYTHONPATH=/tmp"])
    assert result.exit_code == 2 and "PYTHONPATH" in result.output and "export it" in result.output
    result = CliRunner().invoke(app, ["estimate", "--params", "1e9", "--launch-var", "OMP_NUM_THREADS=99999999999"])
    assert result.exit_code == 2 and "OMP_NUM_THREADS" in result.output and "Traceback" not in result.output
