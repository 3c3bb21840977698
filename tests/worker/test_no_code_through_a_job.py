"""No code through a job's launch variables: a preloaded shared object, a ``sitecustomize.py`` on a ``PYTHONPATH``,
a ``PYTHONSTARTUP`` file and a ``BASH_ENV`` script, each writing a marker file when it runs. Through the API the job
is refused (422 naming the variable); placed in the store directly (as an older dstune kept it), ``dstune worker
--once`` fails it with the reason, and no marker is ever written: nothing of it ran."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from tuner.api import create_app
from tuner.storage import Store

TOKEN = "no-code-token"
WORK = {"model": "tiny-gpt2", "model_impl": "builtin", "device": "cpu", "seq_len": 64}
DSTUNE = str(Path(sys.executable).with_name("dstune"))


def _payloads(folder: Path) -> tuple[dict[str, str], list[Path]]:
    """Each variable pointing at code that writes its own marker when it runs, and the markers."""
    site = folder / "site"
    site.mkdir()
    marks = {name: folder / f"ran-{name}" for name in ("PYTHONPATH", "PYTHONSTARTUP", "BASH_ENV", "LD_PRELOAD")}
    (site / "sitecustomize.py").write_text(f"open({str(marks['PYTHONPATH'])!r}, 'w').write('ran')\n")
    startup = folder / "startup.py"
    startup.write_text(f"open({str(marks['PYTHONSTARTUP'])!r}, 'w').write('ran')\n")
    bash_env = folder / "bash_env.sh"
    bash_env.write_text(f"echo ran > {marks['BASH_ENV']}\n")
    variables = {"PYTHONPATH": str(site), "PYTHONSTARTUP": str(startup), "BASH_ENV": str(bash_env)}
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler:  # a shared object whose constructor writes its marker in every process that loads it
        source = folder / "mark.c"
        source.write_text(
            "#include <stdio.h>\n__attribute__((constructor)) static void mark(void) {\n"
            f'  FILE *f = fopen("{marks["LD_PRELOAD"]}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}\n}}\n'
        )
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / "mark.so"), str(source)], check=True)
        variables["LD_PRELOAD"] = str(folder / "mark.so")
    return variables, list(marks.values())


def test_code_through_launch_variables_is_refused_by_the_api_and_never_run_by_the_worker(tmp_path: Path) -> None:
    variables, marks = _payloads(tmp_path)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    with TestClient(create_app(url, TOKEN)) as client:
        for name, value in variables.items():
            body = {"workload": {**WORK, "launch": {"variables": {name: value}}}, "trials": 1, "launcher": "local"}
            answer = client.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
            assert answer.status_code == 422 and name in answer.text, (name, answer.status_code, answer.text)
    store = Store.open(url)
    jobs = {
        name: store.enqueue_job(f"old-{name.lower()}", {"workload": {**WORK, "launch": {"variables": {name: value}}}})
        for name, value in variables.items()
    }
    ended = subprocess.run(
        [DSTUNE, "worker", "--once", "--storage", url], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert "Traceback" not in ended.stderr, ended.stderr
    for name, job in jobs.items():
        record = store.get_job(job.id)
        assert record is not None and record.status == "failed" and name in (record.error or ""), (name, record)
        assert store.get_study(f"old-{name.lower()}") is None  # no study started, so no run
    assert [mark.name for mark in marks if mark.exists()] == []
