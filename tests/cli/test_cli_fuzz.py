"""Bad input, everywhere: a fuzz pass over every ``dstune`` command and option (random and boundary values, malformed
search-space YAML, model ``config.json`` and ds_config files). Every rejection is one line ``error: <field>: ...`` on
stderr with exit code 2, never a traceback, and nothing is written to the database.

Commands that would start real work when their input is valid (measure, tune, serve, worker, best) always get one
invalid input among the random ones, so each example ends at validation; ``estimate`` gets fully random input and may
also succeed (exit 0).
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from tuner.cli.app import app  # noqa: E402

FILES = Path(tempfile.mkdtemp(prefix="dstune-fuzz-"))  # the malformed files (bad_files) and the database
DB = FILES / "untouched.db"
STORAGE = f"sqlite:///{DB}"

BOUNDARY = [
    "",
    " ",
    "0",
    "-0",
    "1",
    "-1",
    "2",
    "7",
    "4097",
    "2147483648",
    "9" * 40,
    "1e3",
    "1e309",
    "-1e309",
    "nan",
    "inf",
    "-inf",
    "0.0",
    "-0.5",
    "0x10",
    "1_000",
    "abc",
    "None",
    "null",
    "true",
    "[]",
    "{}",
    "0GiB",
    "-1GiB",
    "80XB",
    "1e400GiB",
    "18446744073709551617",
    "80GiB",
    "1TiB",
    "gpt2",
    "tiny-gpt2",
    "../../etc/passwd",
    "/dev/null",
    "/",
    "a=b",
    "stage=",
    "=1",
    "stage=9",
    "micro_batch=0",
    "no_such=1",
    "é",
    "\u202e",
    "🙂" * 3,
    "%s%n",
    "--",
    "-x",
]


def _write(name: str, content: str | bytes) -> str:
    path = FILES / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def bad_files() -> dict[str, list[str]]:
    """Malformed inputs by kind: ds_config JSON, model config.json and search-space YAML files."""
    FILES.mkdir(exist_ok=True)
    deep = "[" * 5000 + "]" * 5000
    configs = {
        "trunc.json": '{"zero_optimization": {"stage": 2',
        "array.json": "[1, 2, 3]",
        "scalar.json": "42",
        "empty.json": "",
        "binary.json": b"\xff\xfe\x00\x01garbage",
        "stage_str.json": json.dumps({"zero_optimization": {"stage": "two"}}),
        "stage_9.json": json.dumps({"zero_optimization": {"stage": 9}}),
        "zero_list.json": json.dumps({"zero_optimization": [1]}),
        "neg_batch.json": json.dumps({"train_micro_batch_size_per_gpu": -4}),
        "float_batch.json": json.dumps({"train_micro_batch_size_per_gpu": 2.5}),
        "nan.json": '{"train_micro_batch_size_per_gpu": NaN}',
        "bucket_inf.json": '{"zero_optimization": {"stage": 2, "reduce_bucket_size": Infinity}}',
        "offload_bad.json": json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "tape"}}}),
        "offload_str.json": json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer": "cpu"}}),
        "bf16_str.json": json.dumps({"bf16": "yes"}),
        "typo.json": json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5}}),
        "mismatch.json": json.dumps({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2}),
    }
    models = {
        "m_trunc.json": '{"model_type": "llama", "hidden_size": 4',
        "m_empty_obj.json": "{}",
        "m_type.json": json.dumps({"model_type": "no_such_arch", "hidden_size": 64}),
        "m_neg.json": json.dumps({"model_type": "gpt2", "n_embd": -64, "n_layer": 2, "n_head": 2, "vocab_size": 10}),
        "m_zero_heads.json": json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 0}),
        "m_str.json": json.dumps({"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2}),
        "m_huge.json": json.dumps(
            {"model_type": "llama", "hidden_size": 10**30, "num_hidden_layers": 10**30, "vocab_size": 10**30}
        ),
        "m_float.json": json.dumps({"model_type": "gpt2", "n_embd": 64.5, "n_layer": 2, "n_head": 2}),
        "m_list.json": "[]",
        "m_binary.json": b"\x00\x01\x02",
    }
    spaces = {
        "s_empty.yaml": "",
        "s_scalar.yaml": "42",
        "s_list.yaml": "- a\n- b\n",
        "s_tabs.yaml": "parameters:\n\tstage:\n\t\tkind: categorical\n",
        "s_colon.yaml": "parameters: : :\n",
        "s_unclosed.yaml": "parameters: {stage: [0, 1\n",
        "s_binary.yaml": b"\xff\xfe\x00parameters",
        "s_no_kind.yaml": "parameters:\n  stage:\n    choices: [0, 1]\n    key: zero_optimization.stage\n",
        "s_bad_kind.yaml": "parameters:\n  stage:\n    kind: spline\n    key: zero_optimization.stage\n",
        "s_empty_choices.yaml": "parameters:\n  stage:\n    kind: categorical\n    choices: []\n    key: a.b\n",
        "s_inverted.yaml": "parameters:\n  mb:\n    kind: int\n    low: 8\n    high: 1\n"
        "    key: train_micro_batch_size_per_gpu\n",
        "s_params_list.yaml": "parameters: [1, 2]\n",
        "s_anchor.yaml": "a: &a [1, *a]\nparameters: *a\n",
        "s_bomb.yaml": "a: &a ['x','x','x','x','x','x','x','x','x']\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
        "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\nparameters: *d\n",
        "s_python.yaml": "parameters: !!python/object/apply:os.system ['true']\n",
        "s_condition.yaml": "parameters:\n  stage:\n    kind: categorical\n    choices: [0, 1]\n"
        "    key: zero_optimization.stage\n    when: 'stage >'\n",
    }
    _write("deep.json", deep)  # known finding: see test_known_findings
    out: dict[str, list[str]] = {"config": [], "model": [], "space": []}
    for kind, files in (("config", configs), ("model", models), ("space", spaces)):
        for name, content in files.items():
            out[kind].append(_write(name, content))
    out["config"] += [str(FILES), str(FILES / "missing.json")]
    out["model"] += [str(FILES / "missing" / "config.json"), str(FILES / "s_tabs.yaml")]
    out["space"] += [str(FILES / "missing.yaml"), str(FILES)]
    return out


BAD = bad_files()
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)
VALUE = st.one_of(st.sampled_from(BOUNDARY), TEXT, st.integers().map(str), st.floats().map(repr))
WORKLOAD_OPTIONS = [
    "--model",
    "--params",
    "--gpus",
    "--nodes",
    "--gpu-memory",
    "--cpu-memory",
    "--seq-len",
    "--micro-batch",
    "--grad-accum",
    "--precision",
    "--stage",
    "--offload-optimizer",
    "--offload-param",
    "--nvme-path",
    "--attention",
    "--device",
]
OPTIONS = {
    "estimate": [*WORKLOAD_OPTIONS, "--ds-config"],
    "measure": [
        *WORKLOAD_OPTIONS,
        "--ds-config",
        "--warmup",
        "--steps",
        "--timeout",
        "--launcher",
        "--ray-address",
        "--memory-cap",
        "--model-impl",
    ],
    "tune": [
        *WORKLOAD_OPTIONS,
        "--global-batch",
        "--space",
        "--pin",
        "--sampler",
        "--trials",
        "--timeout",
        "--study",
        "--launcher",
        "--warmup",
        "--steps",
        "--run-timeout",
        "--memory-cap",
        "--seed",
        "--cores-per-node",
    ],
    "best": ["--study", "--format", "--out"],
    "serve": ["--host", "--port", "--token-file", "--max-body-bytes", "--workers", "--recommend-cache"],
    "worker": ["--poll", "--name", "--job", "--launcher"],
}
FILE_OPTIONS = {"--ds-config": "config", "--model": "model", "--space": "space"}
# Inputs rejected before any work starts, one of which every non-estimate example carries.
INVALID = {
    "measure": [
        ("--steps", "0"),
        ("--timeout", "-1"),
        ("--gpus", "0"),
        ("--launcher", "slurm"),
        ("--precision", "fp8"),
        ("--seq-len", "abc"),
        ("--stage", "4"),
    ],
    "tune": [
        ("--trials", "0"),
        ("--sampler", "cmaes"),
        ("--timeout", "eight hours"),
        ("--pin", "stage"),
        ("--pin", "stage=7"),
        ("--pin", "no_such_knob=1"),
        ("--global-batch", "-3"),
        ("--seed", "x"),
        ("--cores-per-node", "0"),
        ("--cores-per-node", "4"),  # without --search-threads: a budget for nothing
    ],
    "best": [("--format", "onnx"), ("--study", "no-such-study")],
    "serve": [
        ("--port", "0"),
        ("--port", "70000"),
        ("--workers", "0"),
        ("--max-body-bytes", "10"),
        ("--token-file", str(FILES / "no-such-token")),
    ],
    "worker": [("--poll", "0"), ("--job", "0"), ("--launcher", "slurm"), ("--job", "abc")],
}
for command in ("measure", "tune"):
    INVALID[command] += [("--ds-config", path) for path in BAD["config"]] if command == "measure" else []
    INVALID[command] += [("--model", path) for path in BAD["model"]]
INVALID["tune"] += [("--space", path) for path in BAD["space"]]
STORAGE_COMMANDS = ("tune", "best", "serve", "worker")


def option_value(option: str) -> st.SearchStrategy[str]:
    if option in FILE_OPTIONS:
        return st.one_of(st.sampled_from(BAD[FILE_OPTIONS[option]]), VALUE)
    return VALUE


@st.composite
def invocation(draw: Any, command: str) -> list[str]:
    """``dstune COMMAND`` with random values for a random subset of its options (and one invalid input when the
    command would otherwise start work)."""
    chosen = draw(st.lists(st.sampled_from(OPTIONS[command]), max_size=6, unique=True))
    args = [command]
    for option in chosen:
        args += [option, draw(option_value(option))]
    if command in INVALID:
        args += list(draw(st.sampled_from(INVALID[command])))
    if command == "estimate" and not {"--model", "--params"} & set(chosen):
        args += draw(st.sampled_from([["--params", "1e9"], ["--model", "tiny-gpt2"], []]))
    if command in STORAGE_COMMANDS:
        args += ["--storage", STORAGE]
    if command == "best" and "--study" not in chosen:
        args += ["--study", "x"]
    return args


def database_untouched() -> bool:
    """The fuzzed commands' database holds no rows: absent, or (opened by a command before it failed) empty."""
    if not DB.exists():
        return True
    with sqlite3.connect(DB) as connection:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        counted = [t for t in tables if t.startswith(("dstune_", "studies", "trials")) and "alembic" not in t]
        return all(connection.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] == 0 for t in counted)


def check(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, f"dstune {' '.join(args)!r} raised {result.exception!r}"
    assert "Traceback" not in result.output, result.output[-2000:]
    allowed = (0, 2) if args[0] == "estimate" else (2,)
    assert result.exit_code in allowed, (args, result.exit_code, result.output[-1000:])
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr[-1000:])
    assert database_untouched(), f"dstune {' '.join(args)!r} wrote to the database"


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.parametrize("command", list(OPTIONS))
def test_fuzzed_input_is_a_one_line_error_or_a_result(command: str) -> None:
    @FUZZ
    @given(invocation(command))
    def run(args: list[str]) -> None:
        check(args)

    run()


@pytest.mark.parametrize("command", list(INVALID))
def test_every_listed_invalid_input_is_rejected_in_one_line(command: str) -> None:
    """Each invalid input of the pool alone (no random company), so every one is exercised once."""
    for option, value in INVALID[command]:
        args = [command, option, value]
        if command in STORAGE_COMMANDS:
            args += ["--storage", STORAGE]
        if command == "best" and option != "--study":
            args += ["--study", "x"]
        if command in ("measure", "tune") and option != "--model":
            args += ["--model", "tiny-gpt2"]
        check(args)


def test_malformed_files_to_estimate_are_one_line_errors() -> None:
    for path in BAD["config"]:
        check(["estimate", "--model", "tiny-gpt2", "--ds-config", path])
    for path in BAD["model"]:
        check(["estimate", "--model", path])


def test_the_real_process_prints_one_line_too() -> None:
    """The installed ``dstune`` script (not the in-process runner) on a few of the invalid inputs."""
    import subprocess
    import sys

    dstune = Path(sys.executable).with_name("dstune")
    if not dstune.exists():
        pytest.skip("no dstune script beside this Python")
    cases = [
        ["estimate", "--model", "tiny-gpt2", "--ds-config", BAD["config"][0]],
        ["tune", "--model", "tiny-gpt2", "--seq-len", "64", "--space", BAD["space"][3], "--storage", STORAGE],
        ["worker", "--poll", "0", "--storage", STORAGE],
    ]
    for args in cases:
        done = subprocess.run([str(dstune), *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args, done.stderr[-2000:])
        assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
    assert database_untouched()


def test_deeply_nested_ds_config_is_one_line() -> None:
    """A fuzz finding: 5,000 nested arrays in a ds_config used to end in a RecursionError traceback."""
    check(["estimate", "--model", "tiny-gpt2", "--ds-config", str(FILES / "deep.json")])
