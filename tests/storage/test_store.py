"""The store's contract, run against every backend (SQLite file and PostgreSQL), as Optuna tests its storages."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from datetime import timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command as alembic_command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from tuner.env import storage_url
from tuner.estimator import estimate
from tuner.measure.measurement import Measurement
from tuner.storage import (
    TABLES,
    TRIAL_STATUSES,
    VERSION_TABLE,
    Base,
    DuplicateConfig,
    Store,
    StoreError,
    TrialRow,
    migrations_dir,
    reason_kind,
)
from tuner.storage.tables import WorkloadRow, utcnow
from tuner.workload import (
    ClusterSpec,
    TrainSpec,
    Workload,
    load_builtin_model,
    model_from_param_count,
    workload_to_dict,
)
from tuner.workload.spec import LEGACY_TRAIN

ROOT = Path(__file__).resolve().parents[2]
DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}


def small_workload(gpus: int = 2) -> Workload:
    return Workload(
        load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=gpus, gpu_memory=24 * 2**30), TrainSpec(seq_len=512)
    )


def new_study(store: Store, name: str = "s1", gpus: int = 2) -> int:
    workload_id = store.upsert_workload(small_workload(gpus))
    return store.get_or_create_study(name, workload_id, "tpe", {"global_batch": 16}).id


def add(store: Store, study_id: int, key: str, number: int = 0, **kwargs: object) -> int:
    return store.add_trial(study_id, number, key, DS_CONFIG, {"stage": 2}, False, None, **kwargs)


def finish_ok(store: Store, study_id: int, key: str, tokens: float | None, number: int = 0) -> int:
    trial_id = add(store, study_id, key, number)
    store.start_trial(trial_id)
    store.finish_trial(trial_id, "ok", {"tokens_per_s": tokens, "peak_bytes_per_rank": [10, 20]})
    return trial_id


def table_names(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def use_optuna(url: str, study_name: str) -> list[float]:
    """Run a few Optuna trials in its own RDBStorage on ``url``; returns the values Optuna stored."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True)
        study.optimize(lambda trial: trial.suggest_float("x", -1.0, 1.0) ** 2, n_trials=3)
        return [trial.value for trial in optuna.load_study(study_name=study_name, storage=storage).trials]
    finally:
        storage.engine.dispose()


class TestStoreContract:
    """Every backend must pass every test here."""

    def test_migrations_create_all_tables(self, store: Store, url: str) -> None:
        names = table_names(url)
        assert set(TABLES) <= names
        assert VERSION_TABLE in names
        assert "alembic_version" not in names  # Optuna's version table is not ours to create
        assert {name for name in names if not name.startswith("dstune_")} == set()
        assert store.current_revision() is not None
        with store.engine.connect() as connection:  # the migrations build exactly what the models describe
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "version_table": VERSION_TABLE}
            )
            assert compare_metadata(context, Base.metadata) == []

    def test_open_migrates_an_empty_database_and_reopen_is_idempotent(self, url: str) -> None:
        with Store(url) as bare:
            assert bare.current_revision() is None
        with Store.open(url) as first:
            revision = first.current_revision()
            study_id = new_study(first)
        with Store.open(url) as second:
            assert second.current_revision() == revision
            assert second.get_study("s1").id == study_id
            second.upgrade()
            assert len(second.list_studies()) == 1

    def test_upgrade_from_the_first_revision_keeps_the_data(self, url: str) -> None:
        """A database made by 0001 (the (study_id, status) index) is brought to head on open with its trials kept,
        and the best-trial query then uses the (study_id, status, tokens_per_s) index."""
        with Store(url) as old:
            old.upgrade("0001")
            study_id = new_study(old)
            finish_ok(old, study_id, "a", 5.0)
            finish_ok(old, study_id, "b", 7.0, number=1)
        with Store.open(url) as store:
            assert store.current_revision() == "0004"
            assert store.best_trial(study_id).tokens_per_s == 7.0
            indexes = {index["name"] for index in sa.inspect(store.engine).get_indexes("dstune_trials")}
            assert "ix_dstune_trials_study_id_status_tokens_per_s" in indexes
            assert "ix_dstune_trials_study_id_status" not in indexes
            alembic_command.downgrade(store.alembic_config(), "0001")  # and back: the old index returns
            indexes = {index["name"] for index in sa.inspect(store.engine).get_indexes("dstune_trials")}
            assert "ix_dstune_trials_study_id_status" in indexes and store.best_trial(study_id).tokens_per_s == 7.0

    def test_workloads_stored_with_the_search_settings_are_found_after_upgrade(self, url: str) -> None:
        """Rows of 0003, whose workload dicts still held ``train.micro_batch``/``grad_accum``/
        ``activation_checkpointing`` (now the trial config's): a study's workload keeps its fingerprint, one stored
        with another micro-batch is merged into its twin, and resuming either study finds its workload."""
        work = small_workload()
        plain = workload_to_dict(work)
        old = {**plain, "train": {**plain["train"], **LEGACY_TRAIN}}
        old_fingerprint = hashlib.sha256(json.dumps(
            {**old, "model": {k: v for k, v in old["model"].items() if k != "name"}}, sort_keys=True
        ).encode()).hexdigest()[:16]  # fmt: skip
        assert old_fingerprint == work.fingerprint()  # as 0003's code computed it: unchanged
        other = {**old, "train": {**old["train"], "micro_batch": 4, "activation_checkpointing": True}}
        with Store(url) as before:
            before.upgrade("0003")
            with before.engine.begin() as connection:
                ids = []
                for data, fingerprint in ((old, old_fingerprint), (other, "f" * 16)):
                    ids.append(connection.execute(
                        sa.insert(WorkloadRow).values(
                            fingerprint=fingerprint, model_family="gpt2", model_name="gpt2", n_params=1, world_size=2,
                            device="cuda", gpu_memory=24 * 2**30, workload=data, created_at=utcnow(),
                        )
                    ).inserted_primary_key[0])  # fmt: skip
            first = before.get_or_create_study("plain", ids[0], "tpe", {}).id
            second = before.get_or_create_study("micro4", ids[1], "tpe", {}).id
        with Store.open(url) as store:
            assert store.current_revision() == "0004"
            with store.session() as session:
                rows = session.scalars(sa.select(WorkloadRow)).all()
            assert [(row.id, row.fingerprint) for row in rows] == [(ids[0], work.fingerprint())]
            assert rows[0].workload == plain  # the search's settings are gone from the stored dict
            for name, study_id in (("plain", first), ("micro4", second)):
                assert store.workload_of(study_id) == work
                resumed = store.get_or_create_study(name, store.upsert_workload(store.workload_of(study_id)), "tpe", {})
                assert resumed.id == study_id

    def test_workload_upsert_by_fingerprint(self, store: Store) -> None:
        workload = small_workload()
        first = store.upsert_workload(workload)
        assert store.upsert_workload(workload) == first
        renamed = Workload(load_builtin_model("gpt2").__class__(**{**workload.model.to_dict(), "name": "other"}))
        renamed = Workload(renamed.model, workload.cluster, workload.train)
        assert store.upsert_workload(renamed) == first  # the name is not part of the fingerprint
        assert store.upsert_workload(small_workload(gpus=4)) != first
        record = store.get_workload(first)
        assert record.fingerprint == workload.fingerprint()
        assert (record.model_family, record.model_name, record.n_params) == ("gpt2", "gpt2", workload.model.n_params)
        assert (record.world_size, record.device, record.gpu_memory) == (2, "cuda", 24 * 2**30)
        assert record.workload["train"]["seq_len"] == 512
        assert record.created_at.tzinfo is not None
        bare = store.upsert_workload(Workload(model_from_param_count(7.5e9)))
        assert store.get_workload(bare).n_params == 7_500_000_000  # beyond 32-bit integers
        with pytest.raises(StoreError, match="workload_id"):
            store.get_workload(10_000)

    def test_study_resume_by_name_and_mismatched_workload(self, store: Store) -> None:
        workload_id = store.upsert_workload(small_workload())
        created = store.get_or_create_study("resnet", workload_id, "tpe", {"space": "zero.yaml", "margin": 0.1})
        assert created.status == "created"
        assert created.optuna_study_name == "resnet"
        assert created.objectives == ["tokens_per_s:maximize"]
        assert created.created_at.tzinfo == timezone.utc
        assert store.workload_of(created.id) == small_workload()
        resumed = store.get_or_create_study("resnet", workload_id, "random", {"space": "other.yaml"})
        assert resumed.id == created.id
        assert (resumed.sampler, resumed.settings) == ("tpe", {"space": "zero.yaml", "margin": 0.1})  # stored wins
        other = store.upsert_workload(small_workload(gpus=8))
        with pytest.raises(StoreError, match="workload") as raised:
            store.get_or_create_study("resnet", other, "tpe", {})
        assert raised.value.field == "workload"
        assert "resnet" in str(raised.value)
        with pytest.raises(StoreError, match="workload_id"):
            store.get_or_create_study("new", 10_000, "tpe", {})
        assert [study.name for study in store.list_studies()] == ["resnet"]
        updated = store.set_study_status(created.id, "running")
        assert updated.status == "running"
        assert updated.updated_at >= created.updated_at
        assert store.get_study(created.id) == store.get_study("resnet") == updated
        assert store.get_study("missing") is None

    def test_duplicate_config_key_rejected_and_nothing_half_written(self, store: Store) -> None:
        study_id = new_study(store)
        first = add(store, study_id, "k1")
        with pytest.raises(DuplicateConfig) as raised:
            add(store, study_id, "k1", number=1)
        assert raised.value.existing_trial_id == first
        assert raised.value.field == "config_key"
        assert [trial.id for trial in store.trials(study_id)] == [first]
        assert add(store, new_study(store, "s2"), "k1")  # another study may run the same config
        with pytest.raises(RuntimeError), store.session() as session:  # a failing unit of work leaves nothing behind
            session.add(TrialRow(study_id=study_id, number=5, config_key="k5", ds_config={}, status="pending"))
            session.flush()
            raise RuntimeError("crash after the insert")
        assert store.find_trial_by_key(study_id, "k5") is None
        assert len(store.trials(study_id)) == 1
        with pytest.raises(StoreError, match="study_id"):
            add(store, 10_000, "k1")
        with pytest.raises(StoreError, match="status"):
            add(store, study_id, "k9", status="running")

    def test_trial_lifecycle(self, store: Store) -> None:
        workload = small_workload()
        study_id = store.get_or_create_study("s1", store.upsert_workload(workload), "tpe", {}).id
        est = estimate(workload, DS_CONFIG)
        trial_id = store.add_trial(
            study_id, 3, "abc", DS_CONFIG, {"stage": 2, "micro": 2}, True, est, constraint=-1.5, hardware="cpu"
        )
        pending = store.find_trial_by_key(study_id, "abc")
        assert pending is not None and pending.id == trial_id
        assert (pending.status, pending.number, pending.attempts) == ("pending", 3, 0)
        assert pending.estimate == est.to_dict()
        assert pending.estimated_peak_bytes == est.gpu_total
        assert (pending.activation_checkpointing, pending.constraint, pending.hardware) == (True, -1.5, "cpu")
        assert pending.measurement is None and pending.started_at is None

        running = store.start_trial(trial_id, hardware="NVIDIA H200")
        assert (running.status, running.attempts, running.hardware) == ("running", 1, "NVIDIA H200")
        assert running.started_at is not None and running.started_at.tzinfo == timezone.utc
        with pytest.raises(StoreError, match="status"):
            store.start_trial(trial_id)

        measurement = Measurement(
            status="ok", tokens_per_s=5120.5, samples_per_s=10.0, peak_bytes_per_rank=[3, None, 7]
        )
        done = store.finish_trial(trial_id, "ok", measurement)
        assert done == store.get_trial(trial_id)
        assert (done.status, done.tokens_per_s, done.peak_bytes, done.error) == ("ok", 5120.5, 7, None)
        assert done.measurement == measurement.to_dict()
        assert done.finished_at is not None and done.finished_at >= done.started_at
        assert done.duration_s is not None and 0 <= done.duration_s < 60
        with pytest.raises(StoreError, match="already ok"):
            store.finish_trial(trial_id, "error")
        with pytest.raises(StoreError, match="status"):
            store.start_trial(trial_id)

        failed_id = add(store, study_id, "oom", number=4)
        store.start_trial(failed_id)
        failed = store.finish_trial(failed_id, "oom", {"status": "oom", "error": "CUDA out of memory"})
        assert (failed.status, failed.error, failed.tokens_per_s, failed.peak_bytes) == (
            "oom",
            "CUDA out of memory",
            None,
            None,
        )
        with pytest.raises(StoreError, match="status"):
            store.finish_trial(failed_id, "bogus")

        pruned_id = add(store, study_id, "big", number=5, status="pruned", prune_reason="too big", constraint=2.0)
        pruned = store.get_trial(pruned_id)
        assert (pruned.status, pruned.prune_reason, pruned.finished_at is not None) == ("pruned", "too big", True)

    def test_stale_running_trials_marked_failed(self, store: Store) -> None:
        study_id = new_study(store)
        other_study = new_study(store, "s2")
        stale = [add(store, study_id, f"k{i}", i) for i in range(2)]
        for trial_id in stale:
            store.start_trial(trial_id)
        finished = finish_ok(store, study_id, "done", 1.0, number=2)
        elsewhere = add(store, other_study, "k0")
        store.start_trial(elsewhere)
        assert store.mark_stale_running_failed(study_id, older_than=timedelta(hours=1)) == []
        assert store.mark_stale_running_failed(study_id) == stale
        for trial_id in stale:
            trial = store.get_trial(trial_id)
            assert trial.status == "failed" and "stale" in (trial.error or "") and trial.finished_at is not None
        assert store.get_trial(finished).status == "ok"
        assert store.get_trial(elsewhere).status == "running"
        assert store.mark_stale_running_failed(study_id) == []
        retried = store.start_trial(stale[0])  # a failed trial may be run again
        assert (retried.status, retried.attempts, retried.error) == ("running", 2, None)
        renumbered = store.retry_trial(stale[1], number=7)  # or queued again under a new Optuna trial number
        assert (renumbered.status, renumbered.number, renumbered.attempts) == ("pending", 7, 1)
        assert store.start_trial(stale[1]).attempts == 2
        with pytest.raises(StoreError, match="cannot retry"):
            store.retry_trial(finished, number=8)

    def test_best_trial(self, store: Store) -> None:
        study_id = new_study(store)
        assert store.best_trial(study_id) is None
        finish_ok(store, study_id, "slow", 100.0, 0)
        best = finish_ok(store, study_id, "fast", 300.0, 1)
        finish_ok(store, study_id, "tie", 300.0, 2)
        finish_ok(store, study_id, "unmeasured", None, 3)
        oom = add(store, study_id, "oom", 4)
        store.start_trial(oom)
        store.finish_trial(oom, "oom", {"tokens_per_s": 999.0})
        assert store.best_trial(study_id).id == best
        assert store.best_trial(new_study(store, "s2")) is None

    def test_trials_query(self, store: Store) -> None:
        study_id = new_study(store)
        ids = [finish_ok(store, study_id, f"k{n}", float(n % 3), number=n) for n in range(5)]
        pending = add(store, study_id, "p", number=9)
        assert [t.id for t in store.trials(study_id)] == [*ids, pending]
        assert [t.id for t in store.trials(study_id, status="pending")] == [pending]
        assert len(store.trials(study_id, status=["ok", "pending"])) == 6
        assert [t.number for t in store.trials(study_id, order_by="-number", limit=2)] == [9, 4]
        assert [t.number for t in store.trials(study_id, order_by="number", limit=2, offset=2)] == [2, 3]
        assert [t.tokens_per_s for t in store.trials(study_id, order_by="-tokens_per_s")] == [2, 1, 1, 0, 0, None]
        with pytest.raises(StoreError, match="order_by"):
            store.trials(study_id, order_by="config_key; DROP TABLE dstune_trials")

    def test_summary_counts_and_pruned_reasons(self, store: Store) -> None:
        study_id = new_study(store)
        best = finish_ok(store, study_id, "ok", 50.0)
        reasons = [
            "GPU memory short by 1024 bytes at the backward phase (largest category: activations)",
            "GPU memory short by 2048 bytes at the backward phase (largest category: activations)",
            "CPU memory per node short by 5 bytes (largest: optimizer_states)",
        ]
        for n, reason in enumerate(reasons, start=1):
            add(store, study_id, f"p{n}", n, status="pruned", prune_reason=reason)
        add(store, study_id, "p0", 9, status="pruned")
        add(store, study_id, "waiting", 10)
        infeasible = store.get_trial(store.add_infeasible(study_id, 11, {"stage": 3}, "micro batch 7 does not divide"))
        assert (infeasible.status, infeasible.ds_config, infeasible.params) == ("pruned", {}, {"stage": 3})
        summary = store.study_summary(study_id)
        assert summary.study.id == study_id
        assert summary.total == 7
        assert set(summary.counts) == set(TRIAL_STATUSES)
        assert (summary.counts["ok"], summary.counts["pruned"], summary.counts["pending"]) == (1, 5, 1)
        assert summary.counts["oom"] == 0
        assert summary.pruned_reasons == {
            reason_kind(reasons[0]): 2,
            "(no reason)": 1,
            "CPU memory per node short by N bytes (largest: optimizer_states)": 1,
            "micro batch 7 does not divide": 1,  # the config's value, not a measured one
        }
        assert summary.best is not None and summary.best.id == best
        with pytest.raises(StoreError, match="study_id"):
            store.study_summary(10_000)

    def test_calibration_round_trip(self, store: Store) -> None:
        assert store.get_calibration("NVIDIA H200", "llama") is None
        stats = {"n": 4, "mean": 1.05, "max": 1.12, "ratios": [1.0, 1.05, 1.03, 1.12]}
        first = store.put_calibration("NVIDIA H200", "llama", margin=0.12, samples=4, stats=stats)
        assert store.get_calibration("NVIDIA H200", "llama") == first
        assert (first.margin, first.samples, first.stats) == (0.12, 4, stats)
        second = store.put_calibration("NVIDIA H200", "llama", margin=0.08, samples=9, stats={"n": 9})
        assert second.id == first.id and second.samples == 9 and second.updated_at >= first.updated_at
        other = store.put_calibration("cpu", "llama", margin=0.3, samples=1)
        assert other.id != first.id and other.stats is None
        assert store.get_calibration("NVIDIA H200", "gpt2") is None

    @pytest.mark.parametrize("optuna_first", [False, True], ids=["dstune-first", "optuna-first"])
    def test_optuna_shares_the_database(self, url: str, optuna_first: bool) -> None:
        if optuna_first:
            assert len(use_optuna(url, "opt")) == 3
        with Store.open(url) as store:
            study_id = new_study(store)
            finish_ok(store, study_id, "k", 10.0)
            assert len(use_optuna(url, "opt")) == (6 if optuna_first else 3)
        names = table_names(url)
        assert {"studies", "trials", "alembic_version", VERSION_TABLE} <= names and set(TABLES) <= names
        with Store.open(url) as store:  # re-migrating leaves Optuna alone, and Optuna still works after
            assert store.best_trial(store.get_study("s1").id).tokens_per_s == 10.0
        assert len(use_optuna(url, "opt")) == (9 if optuna_first else 6)
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        with engine.connect() as connection:
            ours = connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
            theirs = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
        engine.dispose()
        assert len(ours) == len(theirs) == 1 and ours != theirs

    def test_two_stores_share_one_database(self, url: str) -> None:
        with Store.open(url) as tuner_store, Store.open(url) as api_store:
            study_id = new_study(tuner_store)
            assert api_store.get_study("s1").id == study_id
            errors: list[BaseException] = []

            def writer(store: Store, offset: int) -> None:
                try:
                    for n in range(offset, 40, 2):
                        trial_id = add(store, study_id, f"k{n}", n)
                        store.start_trial(trial_id)
                        store.finish_trial(trial_id, "ok", {"tokens_per_s": float(n)})
                        store.study_summary(study_id)
                        # both insert the same workload and study at once: one row each, same ids
                        workload_id = store.upsert_workload(small_workload(gpus=100 + n // 2))
                        store.get_or_create_study(f"race{n // 2}", workload_id, "tpe", {})
                except BaseException as error:
                    errors.append(error)

            threads = [threading.Thread(target=writer, args=(s, i)) for i, s in enumerate((tuner_store, api_store))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert errors == []
            assert tuner_store.study_summary(study_id).counts["ok"] == 40
            assert api_store.best_trial(study_id).tokens_per_s == 39.0
            assert len(api_store.list_studies()) == 21


def test_default_url_and_migrations_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DSTUNE_STORAGE", raising=False)  # tests/test_env.py: the variable wins when set
    assert storage_url() == "sqlite:///dstune.db"
    assert (migrations_dir() / "env.py").is_file()
    assert (migrations_dir() / "alembic.ini").is_file()


def test_alembic_command_line(tmp_path: Path) -> None:
    """``alembic -c db/alembic.ini upgrade head`` works by hand, and leaves the database as Store.open would."""
    db_url = f"sqlite:///{tmp_path / 'cli.db'}"
    alembic = [sys.executable, "-m", "alembic", "-c", str(ROOT / "db" / "alembic.ini"), "-x", f"url={db_url}"]
    for args in (["upgrade", "head"], ["check"], ["current"]):
        done = subprocess.run([*alembic, *args], capture_output=True, text=True, cwd=tmp_path, check=False)
        assert done.returncode == 0, done.stderr
    assert "(head)" in done.stdout
    with Store.open(db_url) as store:
        assert store.current_revision() is not None
        assert store.list_studies() == []
