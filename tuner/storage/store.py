"""The results database: workloads, studies, trials, calibration and jobs (SQLAlchemy 2, migrated with Alembic).

One database URL serves SQLite (``sqlite:///dstune.db``, the default) and PostgreSQL
(``postgresql+psycopg://user@host/db``). Optuna's ``RDBStorage`` may share the same database, so optuna-dashboard can
read it: every table here is prefixed ``dstune_`` and Alembic keeps its revision in ``dstune_alembic_version``, apart
from Optuna's own ``alembic_version``. This module knows nothing of Optuna: a trial's ``number`` is just an integer the
caller chose (the Optuna trial number).

:class:`Store` is the facade; its parts live beside it: connection, sessions and migrations in
:mod:`~tuner.storage.engine`, trials in :mod:`~tuner.storage.trials`, the job queue in :mod:`~tuner.storage.queue`,
the recommender's reads in :mod:`~tuner.storage.queries`. Workloads, studies and calibration are here.

Every public method runs in one short transaction that commits or rolls back as a whole, and returns plain frozen
dataclasses (:class:`WorkloadRecord`, :class:`StudyRecord`, :class:`TrialRecord`, ...) copied out of the session, or
ids: nothing returned is attached to a session, so records stay readable after the store is closed and across threads.

Example:
    >>> import tempfile
    >>> from tuner.workload import Workload, model_from_param_count
    >>> store = Store.open(f"sqlite:///{tempfile.mkdtemp()}/dstune.db")
    >>> workload_id = store.upsert_workload(Workload(model_from_param_count(1e9)))
    >>> study = store.get_or_create_study("demo", workload_id, sampler="tpe", settings={"global_batch": 64})
    >>> trial_id = store.add_trial(study.id, 0, "k0", {"zero_optimization": {"stage": 2}}, {"stage": 2}, False, None)
    >>> store.start_trial(trial_id).status
    'running'
    >>> store.finish_trial(trial_id, "ok", {"tokens_per_s": 1234.5, "peak_bytes_per_rank": [7, 9]}).peak_bytes
    9
    >>> store.best_trial(study.id).id == trial_id
    True
    >>> store.close()
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from tuner.storage.errors import StoreError
from tuner.storage.queries import RecommenderQueries
from tuner.storage.queue import JobQueue
from tuner.storage.records import CalibrationRecord, StudyRecord, WorkloadRecord, existing, to_record
from tuner.storage.tables import STUDY_STATUSES, CalibrationRow, StudyRow, StudyStatus, WorkloadRow, utcnow
from tuner.storage.trials import TrialStore
from tuner.workload import Workload, WorkloadError, workload_from_dict, workload_to_dict


class Store(TrialStore, JobQueue, RecommenderQueries):
    """Access to the results database. Thread-safe; one per process is enough (use :meth:`open`).

    ``Store(url)`` only connects; :meth:`Store.open` also migrates the schema to the newest revision, which is what the
    tuner, the CLI and the API server should call.
    """

    # ----------------------------------------------------------------------------------------------------- workloads

    def upsert_workload(self, workload: Workload) -> int:
        """The id of the workload with this fingerprint, inserting it first if new (the first name seen is kept)."""
        fingerprint = workload.fingerprint()
        for _ in range(2):  # a concurrent insert of the same fingerprint: read the winner's id
            try:
                with self.session() as session:
                    found = session.scalar(sa.select(WorkloadRow.id).where(WorkloadRow.fingerprint == fingerprint))
                    if found is not None:
                        return found
                    row = WorkloadRow(
                        fingerprint=fingerprint,
                        model_family=workload.model.family,
                        model_name=workload.model.name,
                        n_params=workload.model.n_params,
                        world_size=workload.cluster.world_size,
                        device=workload.cluster.device,
                        gpu_memory=workload.cluster.gpu_memory,
                        workload=workload_to_dict(workload),
                    )
                    session.add(row)
                    session.flush()
                    return row.id
            except IntegrityError:
                continue
        raise StoreError("workload", f"cannot insert or find workload {fingerprint}")

    def get_workload(self, workload_id: int) -> WorkloadRecord:
        """A stored workload by id (StoreError if missing)."""
        with self.session(write=False) as session:
            return to_record(WorkloadRecord, existing(session, WorkloadRow, workload_id, "workload"))

    def workload_of(self, study_id: int) -> Workload:
        """The :class:`Workload` a study searches configs for (rebuilt from the stored JSON, and checked as a new one
        is). One stored before a check it now fails (a launch variable since refused) is a :class:`StoreError`
        naming the study: it is never run again, and its records stay readable as stored (:meth:`get_workload`)."""
        with self.session(write=False) as session:
            study = existing(session, StudyRow, study_id, "study")
            row = session.get(WorkloadRow, study.workload_id)
            assert row is not None  # the foreign key guarantees it
            stored, name = row.workload, study.name
        try:
            return workload_from_dict(stored)
        except WorkloadError as error:
            raise StoreError("workload", f"study {name!r} was stored with what is refused now ({error})") from None

    # ------------------------------------------------------------------------------------------------------- studies

    def get_or_create_study(
        self,
        name: str,
        workload_id: int,
        sampler: str,
        settings: dict[str, Any],
        objectives: list[Any] | None = None,
        optuna_study_name: str | None = None,
    ) -> StudyRecord:
        """The study called ``name``, created if new; an existing one is resumed as stored.

        Resuming checks the workload: a study of another workload raises :class:`StoreError` with ``field ==
        "workload"``. Sampler, objectives and settings are not checked: the stored ones are returned, for the caller to
        compare. ``objectives`` defaults to ``["tokens_per_s:maximize"]``, ``optuna_study_name`` to ``name``.
        """
        if not name:
            raise StoreError("name", "a study needs a name")
        for _ in range(2):
            try:
                with self.session() as session:
                    row = session.scalar(sa.select(StudyRow).where(StudyRow.name == name))
                    if row is None:
                        if session.get(WorkloadRow, workload_id) is None:
                            raise StoreError("workload_id", f"no workload {workload_id}")
                        row = StudyRow(
                            name=name,
                            workload_id=workload_id,
                            sampler=sampler,
                            objectives=list(objectives or ["tokens_per_s:maximize"]),
                            settings=dict(settings),
                            status=StudyStatus.CREATED,
                            optuna_study_name=optuna_study_name or name,
                        )
                        session.add(row)
                        session.flush()
                    elif row.workload_id != workload_id:
                        stored = session.get(WorkloadRow, row.workload_id)
                        given = session.get(WorkloadRow, workload_id)
                        raise StoreError(
                            "workload",
                            f"study {name!r} was created for workload {row.workload_id} "
                            f"({stored.fingerprint if stored else '?'}), not workload {workload_id} "
                            f"({given.fingerprint if given else 'missing'}); choose another study name",
                        )
                    return to_record(StudyRecord, row)
            except IntegrityError:
                continue  # created concurrently: read it
        raise StoreError("name", f"cannot create or find study {name!r}")

    def get_study(self, name_or_id: str | int) -> StudyRecord | None:
        """A study by name (str) or id (int), or None."""
        with self.session(write=False) as session:
            if isinstance(name_or_id, int):
                row = session.get(StudyRow, name_or_id)
            else:
                row = session.scalar(sa.select(StudyRow).where(StudyRow.name == name_or_id))
            return None if row is None else to_record(StudyRecord, row)

    def list_studies(self) -> list[StudyRecord]:
        """Every study, newest first."""
        with self.session(write=False) as session:
            rows = session.scalars(sa.select(StudyRow).order_by(StudyRow.created_at.desc(), StudyRow.id.desc()))
            return [to_record(StudyRecord, row) for row in rows]

    def set_study_status(self, study_id: int, status: str) -> StudyRecord:
        """Set a study's status (one of :data:`STUDY_STATUSES`)."""
        if status not in STUDY_STATUSES:
            raise StoreError("status", f"must be one of {', '.join(STUDY_STATUSES)}, got {status!r}")
        with self.session() as session:
            row = existing(session, StudyRow, study_id, "study")
            row.status = str(status)
            session.flush()
            return to_record(StudyRecord, row)

    # --------------------------------------------------------------------------------------------------- calibration

    def get_calibration(self, hardware: str, model_family: str) -> CalibrationRecord | None:
        """The calibration for (hardware, model family), or None."""
        with self.session(write=False) as session:
            row = session.scalar(
                sa.select(CalibrationRow).where(
                    CalibrationRow.hardware == hardware, CalibrationRow.model_family == model_family
                )
            )
            return None if row is None else to_record(CalibrationRecord, row)

    def put_calibration(
        self, hardware: str, model_family: str, margin: float, samples: int, stats: dict[str, Any] | None = None
    ) -> CalibrationRecord:
        """Insert or replace the calibration for (hardware, model family)."""
        for _ in range(2):
            try:
                with self.session() as session:
                    row = session.scalar(
                        sa.select(CalibrationRow).where(
                            CalibrationRow.hardware == hardware, CalibrationRow.model_family == model_family
                        )
                    )
                    if row is None:
                        row = CalibrationRow(hardware=hardware, model_family=model_family)
                        session.add(row)
                    row.margin = float(margin)
                    row.samples = int(samples)
                    row.stats = stats
                    row.updated_at = utcnow()
                    session.flush()
                    return to_record(CalibrationRecord, row)
            except IntegrityError:
                continue
        raise StoreError("calibration", f"cannot store calibration for {hardware}/{model_family}")


__all__ = ["Store"]
