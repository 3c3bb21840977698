"""A stored error as a reader without the token sees it (tuner.storage.public.public_error): no command given as a
string, no credential passed as a flag or assigned, no token-shaped word, no path; the figures and the exception's
words stay."""

from __future__ import annotations

import pytest

from tuner.storage.public import public_error

HIDDEN = [
    (
        "CalledProcessError: Command 'deepspeed train.py --hub_token abc123' returned non-zero exit status 1.",
        ["deepspeed train.py", "--hub_token", "abc123"],
    ),
    (
        "subprocess.TimeoutExpired: Command 'python -c \"import os; os.system('x')\"' timed out after 5 seconds",
        ["python -c", "os.system"],
    ),
    ("RuntimeError: the command exited 1: train.py --api-key sk-abcdefghijklmnopqrstuvwx --lr 0.1", ["sk-abcdef"]),
    ("Task was killed: python train.py --password hunter2", ["hunter2"]),
    ("ValueError: bad header Authorization: Bearer abc.def-0123", ["abc.def-0123"]),
    ("HTTPError: login with token=s3cr3t-value failed", ["s3cr3t-value"]),
    ("KeyError: ghp_" + "Ab3" * 12, ["ghp_"]),
    ("ValueError: hf_" + "x1" * 12 + " is not a repo", ["hf_"]),
    ("AWS: AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI+K7MDENG+bPxRfiCYEXAMPLEKEY refused", ["AKIA", "wJalr"]),
]


@pytest.mark.parametrize(("error", "secrets"), HIDDEN)
def test_a_public_error_shows_no_command_credential_or_token(error: str, secrets: list[str]) -> None:
    shown = public_error(error)
    assert shown is not None
    for secret in secrets:
        assert secret not in shown, shown


@pytest.mark.parametrize(
    "error",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "ncclUnhandledCudaError: Call to CUDA function failed.",
        "rank 1: 3.2 GB at 512 tokens/s, 4096 tokens per step",
        "oom HostMemory: the run needs about 77.13 GiB of this host's memory",
    ],
)
def test_an_ordinary_error_reads_the_same(error: str) -> None:
    assert public_error(error) == error
