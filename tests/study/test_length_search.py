"""``dstune tune --seq-len max``'s logic, fast: the bracketing and bisection of the length over a fake measurer
(tuner.study.length_search), and one length measured, judged and recorded in its own study on a real SQLite store
through a fake dispatcher (tuner.study.length_runs)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from tuner.forecast import Pins, SeqSizer, longest_fit
from tuner.measure.measurement import Measurement, StepHook
from tuner.storage import Store
from tuner.study import LengthRuns, Probe, length_study_name, search_length
from tuner.workload import ClusterSpec, TrialConfig, Workload, load_builtin_model

STEP = 256


class Wall:
    """A fake measurer: lengths up to ``wall`` fit, longer ones do not; ``broken`` lengths fail; counts runs."""

    def __init__(self, wall: int, broken: tuple[int, ...] = ()) -> None:
        self.wall, self.broken, self.asked = wall, broken, []

    def __call__(self, seq_len: int) -> Probe:
        assert seq_len % STEP == 0 and seq_len >= STEP, seq_len
        assert seq_len not in self.asked, f"{seq_len} measured twice"
        self.asked.append(seq_len)
        if seq_len in self.broken:
            return Probe(seq_len, "failed", "timeout: killed after 600 s")
        return Probe(seq_len, "fits" if seq_len <= self.wall else "over")


@pytest.mark.parametrize("start", [256, 1024, 4096, 4352, 4608, 8192, 65536])
@pytest.mark.parametrize("wall", [256, 4352, 5000, 30000])
def test_the_answer_fits_and_one_step_more_was_measured_over(start: int, wall: int) -> None:
    fake = Wall(wall)
    found = search_length(start, STEP, 1 << 20, fake, runs=40)
    assert found.ended == "bracketed"
    assert found.longest == wall // STEP * STEP
    assert found.above == found.longest + STEP
    assert found.probe(found.longest).verdict == "fits" and found.probe(found.above).verdict == "over"
    assert [p.seq_len for p in found.probes] == fake.asked
    assert found.runs <= 2 * (abs(start - wall) // STEP + 1).bit_length() + 2  # gallop then bisect: logarithmic


def test_an_exact_estimate_costs_two_runs() -> None:
    found = search_length(4352, STEP, 1 << 20, Wall(4352), runs=12)
    assert [p.seq_len for p in found.probes] == [4352, 4608]


def test_an_estimate_one_step_long_costs_two_runs_downwards() -> None:
    found = search_length(4608, STEP, 1 << 20, Wall(4352), runs=12)
    assert [p.seq_len for p in found.probes] == [4608, 4352] and found.longest == 4352


def test_start_is_rounded_down_to_the_step_and_kept_within_the_cap() -> None:
    assert search_length(4500, STEP, 1 << 20, Wall(4352), runs=12).probes[0].seq_len == 4352
    assert search_length(10, STEP, 1 << 20, Wall(4352), runs=12).probes[0].seq_len == 256
    capped = search_length(8192, STEP, 1024, Wall(1 << 20), runs=12)
    assert capped.probes[0].seq_len == 1024 and capped.ended == "cap" and capped.longest == 1024


def test_the_cap_ends_a_search_that_keeps_fitting() -> None:
    found = search_length(256, STEP, 2000, Wall(1 << 20), runs=20)
    assert found.ended == "cap" and found.longest == 1792 == found.cap and found.above is None


def test_nothing_fits_ends_at_the_floor() -> None:
    found = search_length(4096, STEP, 1 << 20, Wall(100), runs=20)
    assert found.ended == "floor" and found.longest is None and found.above == 256


def test_out_of_runs_keeps_the_bounds_measured_so_far() -> None:
    found = search_length(256, STEP, 1 << 20, Wall(30000), runs=4)
    assert found.ended == "budget" and found.runs == 4
    assert found.longest is not None and found.longest <= 30000 and found.above is None


def test_a_failed_run_stops_the_search_without_guessing() -> None:
    found = search_length(4096, STEP, 1 << 20, Wall(8000, broken=(4864,)), runs=12)
    assert found.ended == "failed" and found.longest == 4352 and found.above is None
    assert found.probes[-1].note.startswith("timeout")


def test_a_non_multiple_step_from_sequence_parallelism() -> None:
    step = 768  # lcm(256, sp = 3)
    found = search_length(5000, step, 1 << 20, lambda n: Probe(n, "fits" if n <= 6000 else "over"), runs=12)
    assert found.longest == 5376 and found.above == 6144 and all(p.seq_len % step == 0 for p in found.probes)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        search_length(1024, 256, 128, Wall(1024), runs=4)
    with pytest.raises(ValueError):
        search_length(1024, 256, 4096, Wall(1024), runs=0)


class Peaks:
    """A fake dispatcher (tuner.study.Measurer): every run trains, its peak growing by ``per_token`` bytes a token."""

    slots = 1

    def __init__(self, per_token: int) -> None:
        self.per_token, self.lengths = per_token, []

    def submit(self, workload: Workload, trial: TrialConfig, on_step: StepHook | None = None) -> Future[Measurement]:
        self.lengths.append(workload.train.seq_len)
        future: Future[Measurement] = Future()
        peak = workload.train.seq_len * self.per_token
        future.set_result(Measurement(status="ok", tokens_per_s=1e3, peak_bytes_per_rank=[peak, peak - 1]))
        return future

    def cancel(self) -> None:
        pass


def test_each_length_is_recorded_in_its_study_and_a_rerun_measures_nothing(tmp_path: Path) -> None:
    work = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=2, device="cpu", gpu_memory=2**30))
    pins = Pins(sp=1, tiled_mlp_shards=1, tiled_loss_shards=1, offload_checkpoints=False)
    answer = longest_fit(work, pins, cap=1 << 16)
    wall = answer.seq_len + 3 * STEP + 100  # the measured wall: three steps past the estimate
    fake = Peaks(per_token=2**30 // wall)
    longest = wall // STEP * STEP
    store = Store.open(f"sqlite:///{tmp_path / 'dstune.db'}")
    runs = LengthRuns(store, "tiny", SeqSizer(work), answer.candidate, pins, fake)
    found = search_length(answer.seq_len, answer.multiple, 1 << 20, runs, runs=12)
    assert (found.ended, found.longest, found.above) == ("bracketed", longest, longest + STEP)
    assert fake.lengths == [answer.seq_len + n * STEP for n in (0, 1, 3, 7, 5, 4)]  # gallop up, then bisect
    over = store.trials(store.get_study(length_study_name("tiny", longest + STEP)).id)
    assert [t.status for t in over] == ["oom"] and "exceeds" in over[0].error
    fit = store.trials(store.get_study(f"tiny:{longest}").id)
    assert [t.status for t in fit] == ["ok"] and fit[0].peak_bytes <= 2**30 and fit[0].estimate["per_gpu"]["total"]
    assert store.workload_of(fit[0].study_id).train.seq_len == longest
    stored = store.get_study(f"tiny:{longest}").settings["candidate"]  # the Ulysses degree keyed as it always was
    assert stored["sequence_parallel"] == answer.candidate.sp and set(stored) == {
        *("stage", "offload_optimizer", "offload_param", "activation_checkpointing", "sequence_parallel"),
        *("tiled_mlp", "tiled_loss", "offload_checkpoints", "micro_batch"),
    }
    measured = list(fake.lengths)
    again = search_length(answer.seq_len, answer.multiple, 1 << 20, runs, runs=12)  # resumed from the records
    assert fake.lengths == measured and again.longest == longest
    assert all(p.details["reused"] for p in again.probes)
