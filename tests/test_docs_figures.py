"""The docs agree with the tool on every figure they quote from it: each quoted command in the README,
``docs/*.md`` and ``bench/results/*.md`` written as ```dstune estimate ...` answers N tokens`` (or ``N trainable
parameters``) is run and its answer compared (estimates only: the profile of each model is traced once and cached
for the session)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
QUOTE = re.compile(r"`(dstune estimate [^`]+)`\s+answers\s+([\d,]+)\s+(tokens|trainable parameters)")


CONSOLE = re.compile(r"```console\n\$ (dstune estimate [^\n]+)\n(.*?)```", re.S)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(RESULTS.glob("*.md"))]


def flat(text: str) -> str:
    """Printed text without the table's box drawing and with its wrapping undone: a quoted excerpt matches at any
    terminal width."""
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", text).split())


def outputs() -> list[tuple[str, str, list[str]]]:
    """(file, command, parts) for every ```console block that quotes a ``$ dstune estimate`` command and what it
    prints: each part (between ``...`` lines) appears in the output as it is, in order."""
    found = []
    for path in documents():
        for command, printed in CONSOLE.findall(path.read_text()):
            parts = [flat(part) for part in re.split(r"^\.\.\.$", printed, flags=re.M)]
            found.append((path.name, command, [part for part in parts if part]))
    return found


def quotes() -> list[tuple[str, str, int, str]]:
    """(file, command, figure, what) for every quoted answer in the docs (a command may wrap over lines)."""
    found = []
    for path in documents():
        text = " ".join(path.read_text().split())
        for command, figure, what in QUOTE.findall(text):
            found.append((path.name, command, int(figure.replace(",", "")), what))
    return found


def test_the_docs_quote_the_headline_answers() -> None:
    """The headline figures are quoted in the checked form (a doc that drops the form drops the check)."""
    files = {file for file, *_ in quotes()}
    assert {"memory-model.md", "long-context-runs.md", "README.md"} <= files, files
    assert "memory-model.md" in {file for file, *_ in outputs()}


@pytest.mark.parametrize(("file", "command", "parts"), outputs(), ids=lambda v: str(v)[:60])
def test_a_quoted_output_is_what_the_tool_prints(file: str, command: str, parts: list[str]) -> None:
    result = CliRunner().invoke(app, shlex.split(command)[1:])
    assert result.exit_code == 0, (file, command, result.output)
    printed, start = flat(result.output), 0
    for part in parts:
        found = printed.find(part, start)
        assert found >= 0, f"{file}: `{command}` does not print, where the doc says it does:\n{part}\n\n{printed}"
        start = found + len(part)


@pytest.mark.parametrize(("file", "command", "figure", "what"), quotes(), ids=lambda v: str(v)[:60])
def test_a_quoted_answer_is_what_the_tool_answers(
    file: str, command: str, figure: int, what: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    adapter = re.search(r"cat > adapter_config.json <<'JSON'\n(.*?)\nJSON", (ROOT / "README.md").read_text(), re.S)
    assert adapter is not None
    (tmp_path / "adapter_config.json").write_text(adapter.group(1))  # the README's worked example's file
    result = CliRunner().invoke(app, [*shlex.split(command)[1:], "--json"])
    assert result.exit_code == 0, (file, command, result.output)
    answer = json.loads(result.stdout)
    found = answer["max_seq_len"]["seq_len"] if what == "tokens" else answer["trainable_params"]
    assert found == figure, f"{file}: `{command}` answers {found:,} {what}, the doc says {figure:,}"
