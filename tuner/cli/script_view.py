"""What a script study's winner looks like on the CLI: the ds_config its command trained with, and the command with
it filled in (:mod:`tuner.measure.script.answer`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Console

from tuner.cli.common import write_text_file
from tuner.cli.confirm_view import print_confirmation
from tuner.cli.facts_view import print_numerics
from tuner.measure.script.answer import script_answer
from tuner.measure.script.estimate_note import assumption

if TYPE_CHECKING:
    from tuner.storage import TrialRecord


def render_script_best(best: TrialRecord, console: Console) -> bool:
    """Print the winner of a script study (False: the study measured dstune's own trainer)."""
    answer = script_answer((best.measurement or {}).get("script"))
    if answer is None:
        return False
    console.print(
        f"best: trial {best.number}, {best.tokens_per_s:,.0f} tokens/s ({answer['note']}); its ds_config:",
        highlight=False,
        soft_wrap=True,
    )
    console.print_json(json.dumps(answer["ds_config"]))
    _print_code_paths(answer, console)
    print_numerics(best, console)
    print_confirmation(best, console)
    _print_command(answer, console)
    if best.estimate:  # none for a command's own model given without --model
        console.print(
            f"the winner's estimate assumes {assumption(best.trial)}", highlight=False, soft_wrap=True, markup=False
        )
    return True


def export_script_best(best: TrialRecord, out: str | None) -> bool:
    """Write (or print) a script study's winning ds_config and say how to run the command with it (False: not a
    script study). The HF form is the same file: the command's HF Trainer read it as it is."""
    answer = script_answer((best.measurement or {}).get("script"), out or "ds_config.json")
    if answer is None:
        return False
    text = json.dumps(answer["ds_config"], indent=2) + "\n"
    err = Console(stderr=True)
    if out:
        write_text_file(out, text)
        err.print(f"wrote {out} (trial {best.number}, {best.tokens_per_s:,.0f} tokens/s)", markup=False)
    else:
        print(text, end="")
    err.print(answer["note"], highlight=False, soft_wrap=True, markup=False)
    _print_code_paths(answer, err)
    print_numerics(best, err)
    print_confirmation(best, err)
    _print_command(answer, err)
    return True


def _print_code_paths(answer: dict[str, str | None], console: Console) -> None:
    """Whether the command's model ran DeepSpeed's chunked loss and Liger's kernels, as its ranks saw it."""
    if answer.get("code_paths"):
        console.print(str(answer["code_paths"]), highlight=False, soft_wrap=True, markup=False)


def _print_command(answer: dict[str, str | None], console: Console) -> None:
    console.print(f"run it: {answer['command']}", highlight=False, soft_wrap=True, markup=False)
    if answer.get("config_file_edits"):
        console.print(str(answer["config_file_edits"]), highlight=False, soft_wrap=True, markup=False)
