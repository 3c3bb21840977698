"""Fault injection, measured: every fault of the fault-injection suite injected N times, each with a pass criterion
that can fail.

Per fault it counts injections, recoveries (the criterion held), lost measurements (a trial finished before the fault
that is missing or changed after recovery; a job that never ends), duplicates (a config measured twice in a study, a
job run by two workers), orphaned processes (ranks alive ``ORPHAN_GRACE_S`` after whoever owned them was gone) and
the time to recover, then writes ``bench/results/faults.md``.

Faults: a rank SIGKILLed / SIGSTOPped mid-step (local launcher, real DeepSpeed), the tuner SIGKILLed with a run in
flight (``dstune tune``, local launcher and Ray) then resumed, the node's fork server SIGKILLed / SIGSTOPped while a
study's 2-rank run is in flight (``tests/faults/test_forkserver_faults.py``), a Ray worker node removed mid-run,
PostgreSQL restarted under a running worker, two tuners on one study, two workers on one queue, a worker SIGKILLed /
SIGSTOPped mid-job; and hostile input and broken environments (``bench/hostile.py``: ``dstune serve``
stopped with its profiling worker busy, backtracking patterns, non-finite numbers, bad storage, an unreachable
database, a full disk, an unwritable ``--out``, a YAML alias bomb, hostile study names). The database faults run on
a private PostgreSQL server (never the shared one); the tuner's on SQLite, the CLI default.

Run: ``PYTHONPATH=. .venv/bin/python bench/faults.py [--n 3] [--n-deepspeed 2] [--only NAME,...]`` (about 12 minutes
on two shared cores with the defaults). With ``--only``, the rows measured replace (or join) theirs in the existing
results file and the others are kept.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ROOT / "tests" / "faults"
sys.path.insert(0, str(FAULTS))
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import hostile  # noqa: E402  (bench/hostile.py)
import security  # noqa: E402  (bench/security.py)
import security_budget  # noqa: E402  (bench/security_budget.py)
import security_hostile  # noqa: E402  (bench/security_hostile.py)
import security_launch  # noqa: E402  (bench/security_launch.py)
import sqlalchemy as sa  # noqa: E402
from faultkit import MARKER_ENV, PrivatePostgres, marked_processes, pruned_job_request, rank_processes, wait_for  # noqa: E402

from tuner.storage import Store  # noqa: E402

ORPHAN_GRACE_S = 10.0
DSTUNE = str(Path(sys.executable).with_name("dstune"))
TUNE = [
    *("--model", "tiny-gpt2", "--gpus", "1", "--seq-len", "32", "--device", "cpu", "--gpu-memory", "64GiB"),
    *("--global-batch", "4", "--warmup", "1", "--steps", "2", "--sampler", "random", "--trials", "3"),
]


@dataclass
class Outcome:
    """One injection: did the criterion hold, and what was lost, doubled or orphaned."""

    recovered: bool
    lost: int = 0
    duplicated: int = 0
    orphans: int = 0
    recover_s: float | None = None
    note: str = ""


@dataclass
class Row:
    name: str
    criterion: str
    outcomes: list[Outcome] = field(default_factory=list)


def new_marker() -> str:
    marker = f"dstune-bench-{uuid.uuid4().hex}"
    os.environ[MARKER_ENV] = marker
    return marker


def orphans_after(marker: str, since: float) -> tuple[int, float]:
    """(ranks still alive ORPHAN_GRACE_S after ``since``, seconds until the last one was gone)."""
    deadline = since + ORPHAN_GRACE_S
    while time.monotonic() < deadline:
        if not rank_processes(marked_processes(marker)):
            return 0, time.monotonic() - since
        time.sleep(0.1)
    left = rank_processes(marked_processes(marker))
    for process in left:
        with contextlib.suppress(Exception):
            process.kill()
    return len(left), time.monotonic() - since


# ------------------------------------------------------------------------------------------ ranks (real DeepSpeed)
def rank_fault(fault: str) -> Outcome:
    from test_process_faults import ENTRY, run_spec

    from tuner.measure.driver.local_launcher import launch_local

    marker = new_marker()
    timeout = 90.0
    result = launch_local(run_spec(2), timeout=timeout, entry=[sys.executable, str(ENTRY), fault, "1"])
    returned = time.monotonic()
    orphans, _ = orphans_after(marker, returned)
    expected = "error" if fault == "sigkill" else "timeout"
    failed_at = result.ranks[1].failed_at if len(result.ranks) > 1 else None
    recover = time.time() - failed_at if failed_at else result.timings.get("wall_s")
    return Outcome(result.status == expected and orphans == 0, orphans=orphans, recover_s=recover, note=result.status)


# ------------------------------------------------------------------------------------------ the tuner SIGKILLed
def tuner_kill(launcher: str) -> Outcome:
    marker = new_marker()
    folder = Path(tempfile.mkdtemp(prefix="dstune-bench-"))
    storage = f"sqlite:///{folder / 'dstune.db'}"
    command = [DSTUNE, "tune", *TUNE, "--launcher", launcher, "--storage", storage, "--study", "k", "--seed", "9"]
    tuner = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: rank_processes(marked_processes(marker)), 600, "a run in flight")
    finally:
        os.kill(tuner.pid, signal.SIGKILL)
        tuner.wait()
    orphans, gone_s = orphans_after(marker, time.monotonic())
    before = {t.config_key: t for t in trials(storage, "k")}
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    resumed_s = time.monotonic() - started
    after = {t.config_key: t for t in trials(storage, "k")}
    finished = {k: t for k, t in before.items() if t.status not in ("running", "pending")}
    lost = sum(1 for k, t in finished.items() if k not in after or after[k].tokens_per_s != t.tokens_per_s)
    duplicated = sum(1 for k, t in finished.items() if k in after and after[k].attempts != t.attempts)
    left_running = sum(1 for t in after.values() if t.status in ("running", "pending"))
    ok = done.returncode in (0, 1) and not (lost or duplicated or left_running or orphans)
    return Outcome(ok, lost, duplicated, orphans, gone_s, f"resume {resumed_s:.0f} s, {left_running} left running")


# ------------------------------------------------------------------------------------------ the fork server
def fork_server_fault(fault: signal.Signals) -> Outcome:
    """The node's fork server SIGKILLed or SIGSTOPped while a one-config study's 2-rank run is in flight: killed, the
    run must be lost infrastructure and the config measured again to ``ok``; stopped, the study must end (the ranks
    carry on, the launcher stops asking the silent server) with the config ``ok``. recover: from the fault to the
    run classified lost (SIGKILL) or measured (SIGSTOP)."""
    from test_forkserver_faults import fork_server_fault as scenario

    marker = new_marker()
    result = scenario(Path(tempfile.mkdtemp(prefix="dstune-bench-")), fault, marker)
    ending = "failed" if fault == signal.SIGKILL else "ok"
    ended = [at for at, event in result.events if event.status == ending]
    recover = ended[0] - result.injected_at if ended else None
    expected_attempts = 2 if fault == signal.SIGKILL else 1
    ended_s = result.ended_at - result.injected_at
    ok = result.status == "ok" and result.attempts == expected_attempts and not result.orphans
    lost = 0 if result.status == "ok" else 1
    return Outcome(
        ok,
        lost=lost,
        duplicated=max(0, result.attempts - expected_attempts),
        orphans=result.orphans,
        recover_s=recover,
        note=f"final {result.status} after {result.attempts} attempt(s); study ended {ended_s:.0f} s after the fault",
    )


def trials(storage: str, study: str) -> list:
    with Store.open(storage) as store:
        record = store.get_study(study)
        return store.trials(record.id) if record else []


def ray_node_removed() -> Outcome:
    import ray
    from ray.cluster_utils import Cluster
    from test_process_faults import run_spec

    from tuner.measure.driver.ray_launcher import launch_ray

    marker = new_marker()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    node = cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        outcome: list = []
        spec = run_spec(1, steps=100_000, nodes=2)  # one rank on each single-CPU node
        run = threading.Thread(target=lambda: outcome.append(launch_ray(spec, timeout=600)))
        run.start()
        wait_for(lambda: len(rank_processes(marked_processes(marker))) == 2, 600, "both ranks")
        time.sleep(2)
        removed = time.monotonic()
        cluster.remove_node(node)
        run.join(timeout=300)
        failed_in = time.monotonic() - removed
        orphans, _ = orphans_after(marker, time.monotonic())
        result = outcome[0] if outcome else None
        rerun = launch_ray(run_spec(1), timeout=300).status
        ok = result is not None and result.status == "error" and bool(result.error) and not orphans and rerun == "ok"
        reason = (result.exception_type or "") if result else "no result"
        return Outcome(ok, orphans=orphans, recover_s=failed_in, note=f"{reason}; rerun on the rest: {rerun}")
    finally:
        ray.shutdown()
        cluster.shutdown()


# ------------------------------------------------------------------------------------------ database and queue
def fresh_db(server: PrivatePostgres) -> str:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server.url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return sa.make_url(server.url).set(database=name).render_as_string(hide_password=False)


def study_faults(url: str, study: str) -> tuple[int, int]:
    """(trials left running or pending, configs recorded twice) in a study."""
    import optuna

    rows = trials(url, study)
    running = sum(1 for t in rows if t.status in ("running", "pending"))
    running += sum(1 for t in optuna.load_study(study_name=study, storage=url).trials if t.state.name == "RUNNING")
    return running, len(rows) - len({t.config_key for t in rows})


def pg_restart(server: PrivatePostgres) -> Outcome:
    from tuner.worker import work

    url = fresh_db(server)
    with Store.open(url) as store:
        job = store.enqueue_job("r", pruned_job_request("r", trials=300))  # still running at the restart
        stop = threading.Event()
        thread = threading.Thread(target=work, args=(store, "w"), kwargs={"poll": 0.2, "lease_s": 60.0, "stop": stop})
        thread.start()
        try:
            wait_for(lambda: (store.get_job(job.id).progress or {}).get("trials", 0) >= 5, 180)
            before = store.get_job(job.id).progress["trials"]
            server.stop()
            time.sleep(2.0)
            server.start()
            back = time.monotonic()
            wait_for(lambda: (store.get_job(job.id).progress or {}).get("trials", 0) > before, 300, "progress")
            recover = time.monotonic() - back
            wait_for(lambda: store.get_job(job.id).status not in ("queued", "running"), 300)
        finally:
            stop.set()
            thread.join(timeout=120)
        final = store.get_job(job.id)
    running, doubled = study_faults(url, "r")
    ok = final.status == "done" and final.attempts == 1 and not running and not doubled
    return Outcome(
        ok, lost=running, duplicated=doubled, recover_s=recover, note=f"{final.status} after {final.attempts} claim(s)"
    )


def two_tuners(server: PrivatePostgres) -> Outcome:
    url = fresh_db(server)
    log = Path(tempfile.mkstemp(prefix="dstune-measured-")[1])
    with Store.open(url):
        pass
    command = [sys.executable, str(FAULTS / "tune_proc.py"), url, "shared", "30", "7", str(log)]
    processes = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    codes = [process.wait(timeout=600) for process in processes]
    measured = Counter(log.read_text().splitlines())
    doubled = sum(count - 1 for count in measured.values())
    running, recorded_twice = study_faults(url, "shared")
    ok = codes == [0, 0] and not doubled and not running and not recorded_twice
    return Outcome(ok, lost=running, duplicated=doubled + recorded_twice, note=f"{len(measured)} configs measured")


def worker_procs(url: str, names: list[str], lease_s: float) -> list[subprocess.Popen[bytes]]:
    script = str(FAULTS / "worker_proc.py")
    return [
        subprocess.Popen([sys.executable, script, url, name, str(lease_s)], stderr=subprocess.DEVNULL) for name in names
    ]


def stop_procs(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
        process.wait(timeout=60)


def two_workers(server: PrivatePostgres) -> Outcome:
    url = fresh_db(server)
    with Store.open(url) as store:
        jobs = [store.enqueue_job(f"q{i}", pruned_job_request(f"q{i}", trials=4)).id for i in range(6)]
        processes = worker_procs(url, ["left", "right"], 30.0)
        try:
            wait_for(lambda: all(store.get_job(j).status == "done" for j in jobs), 300)
        finally:
            stop_procs(processes)
        finals = [store.get_job(j) for j in jobs]
    doubled = sum(job.attempts - 1 for job in finals)
    return Outcome(not doubled, duplicated=doubled, note=str(Counter(job.worker for job in finals)))


def worker_fault(server: PrivatePostgres, fault: signal.Signals) -> Outcome:
    from tuner.worker import work

    url = fresh_db(server)
    lease_s = 2.0
    with Store.open(url) as store:
        job = store.enqueue_job("w", pruned_job_request("w", trials=40))
        processes = worker_procs(url, ["doomed"], lease_s)
        stop = threading.Event()
        try:
            wait_for(lambda: (store.get_job(job.id).progress or {}).get("trials", 0) >= 5, 180)
            os.kill(processes[0].pid, fault)
            injected = time.monotonic()
            rescuer = threading.Thread(
                target=work, args=(store, "rescuer"), kwargs={"poll": 0.2, "lease_s": lease_s, "stop": stop}
            )
            rescuer.start()
            wait_for(lambda: store.get_job(job.id).worker == "rescuer", 180)
            recover = time.monotonic() - injected
            if fault == signal.SIGSTOP:
                os.kill(processes[0].pid, signal.SIGCONT)
            wait_for(lambda: store.get_job(job.id).status not in ("queued", "running"), 300)
        finally:
            stop.set()
            stop_procs(processes)
        final = store.get_job(job.id)
    running, doubled = study_faults(url, "w")
    ok = final.status == "done" and final.attempts == 2 and not running and not doubled
    return Outcome(ok, lost=running, duplicated=doubled, recover_s=recover, note=f"lease {lease_s:.0f} s")


# ------------------------------------------------------------------------------------------ the matrix
def matrix(server: PrivatePostgres) -> list[tuple[str, str, bool, Callable[[], Outcome]]]:
    """(name, pass criterion, needs DeepSpeed, injection)."""
    return [
        ("rank SIGKILL mid-step", "run `error`, peer gone", True, lambda: rank_fault("sigkill")),
        ("rank SIGSTOP mid-step", "run `timeout` (90 s), peer gone", True, lambda: rank_fault("sigstop")),
        ("tuner SIGKILL, local", "no rank left, resume: nothing lost/rerun", True, lambda: tuner_kill("local")),
        ("tuner SIGKILL, Ray", "no rank left, resume: nothing lost/rerun", True, lambda: tuner_kill("ray")),
        (
            "fork server SIGKILL mid-run",
            "run `InfraLost`, config measured again: `ok`",
            True,
            lambda: fork_server_fault(signal.SIGKILL),
        ),
        (
            "fork server SIGSTOP mid-run",
            "no hang: ranks finish, config `ok`",
            True,
            lambda: fork_server_fault(signal.SIGSTOP),
        ),
        ("Ray node removed", "run `error` with reason, rest measures", True, ray_node_removed),
        ("PostgreSQL restart (worker)", "job done without take-over", False, lambda: pg_restart(server)),
        ("two tuners, one study", "each config measured once", False, lambda: two_tuners(server)),
        ("two workers, one queue", "each job run once", False, lambda: two_workers(server)),
        (
            "worker SIGKILL mid-job",
            "job taken over, study resumes",
            False,
            lambda: worker_fault(server, signal.SIGKILL),
        ),
        (
            "worker SIGSTOP mid-job",
            "job taken over, study resumes",
            False,
            lambda: worker_fault(server, signal.SIGSTOP),
        ),
        *hostile.rows(),  # hostile input and broken environments
        *security.rows(),  # no code through a job, no secret to a reader, bounded cost
        *security_hostile.rows(),  # the same, one variation away
        *security_launch.rows(),  # launch variables: many names and values, code in stored jobs
        *security_budget.rows(),  # expensive answers once per canonical request, deep configs before any build
    ]


def render(rows: list[Row], n: int, n_ds: int, elapsed: float) -> str:
    lines = [
        "# Faults, measured",
        "",
        f"`PYTHONPATH=. .venv/bin/python bench/faults.py --n {n} --n-deepspeed {n_ds}` on this machine (2 shared CPU "
        f"cores, no GPU), {elapsed / 60:.1f} minutes. Each fault injected N times; *recovered* counts injections whose "
        f"criterion held. *lost*: finished trials missing or changed after recovery (trials or Optuna trials left "
        f"running for the database faults); *duplicated*: configs measured twice, jobs run twice; *orphaned*: ranks "
        f"alive {ORPHAN_GRACE_S:.0f} s after their owner was gone; *recover*: median seconds from the fault to the "
        "run classified (ranks), the last rank gone (tuner), the run failed (node), the study progressing again "
        "(PostgreSQL) or the job taken over (worker).",
        "",
        "| fault | criterion | injections | recovered | lost | duplicated | orphaned | recover (s) | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        out = row.outcomes
        times = [o.recover_s for o in out if o.recover_s is not None]
        median = f"{statistics.median(times):.1f}" if times else "-"
        notes = "; ".join(sorted({o.note for o in out if o.note}))[:160]
        lines.append(
            f"| {row.name} | {row.criterion} | {len(out)} | {sum(o.recovered for o in out)} | "
            f"{sum(o.lost for o in out)} | {sum(o.duplicated for o in out)} | {sum(o.orphans for o in out)} | "
            f"{median} | {notes} |"
        )
    return "\n".join(lines) + "\n"


def merged(previous: str, fresh: str, only: str) -> str:
    """``previous`` results with the rows of ``fresh`` in place of theirs (new ones after the rest), and a line
    saying which rows were measured again and how."""
    fresh_rows = {line.split("|")[1].strip(): line for line in fresh.splitlines() if _is_row(line)}
    lines = []
    for line in previous.splitlines():
        name = line.split("|")[1].strip() if _is_row(line) else None
        lines.append(fresh_rows.pop(name) if name in fresh_rows else line)
    last_row = max(i for i, line in enumerate(lines) if line.startswith("|"))
    lines[last_row + 1 : last_row + 1] = list(fresh_rows.values())
    command = next(line for line in fresh.splitlines() if line.startswith("`"))
    minutes = re.search(r"([\d.]+ minutes)", command)
    how = f"`{command.split('`')[1]} --only '{only}'`, {minutes.group(1) if minutes else ''}"
    return "\n".join(lines) + f"\n\nRows measured again: {how}.\n"


def _is_row(line: str) -> bool:
    return line.startswith("| ") and not line.startswith("| fault ") and "---" not in line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3, help="injections per fault without DeepSpeed")
    parser.add_argument("--n-deepspeed", type=int, default=2, help="injections per fault with DeepSpeed runs")
    parser.add_argument("--only", default="", help="comma-separated fault names (substrings)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "faults.md"))
    args = parser.parse_args()
    started = time.monotonic()
    server = PrivatePostgres()
    server.start()
    rows: list[Row] = []
    try:
        for name, criterion, deepspeed, inject in matrix(server):
            if args.only and not any(part in name for part in args.only.split(",")):
                continue
            row = Row(name, criterion)
            for number in range(args.n_deepspeed if deepspeed else args.n):
                try:
                    outcome = inject()
                except Exception as error:  # the injection itself failed: not recovered, and say why
                    outcome = Outcome(False, note=f"{type(error).__name__}: {error}"[:120])
                row.outcomes.append(outcome)
                print(f"{name} #{number + 1}: {outcome}", flush=True)
            rows.append(row)
    finally:
        server.destroy()
    text = render(rows, args.n, args.n_deepspeed, time.monotonic() - started)
    if args.only and Path(args.out).exists():
        text = merged(Path(args.out).read_text(), text, args.only)
    Path(args.out).write_text(text)
    print(text)
    return 0 if all(o.recovered for row in rows for o in row.outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
