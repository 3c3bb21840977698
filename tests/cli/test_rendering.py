"""What the CLI prints from runs, estimates and exports is printed as it is: rich reads ``[...]`` as markup, and an
error's ``[rank0]:``, an export note's ``[lm_head.weight]`` or a path with brackets would vanish from the line."""

from __future__ import annotations

from rich.console import Console

from tuner.cli.estimate import render
from tuner.cli.measure import render_measurement
from tuner.estimator import estimate
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model


def test_a_runs_error_prints_with_its_brackets() -> None:
    console = Console(record=True, width=200)
    error = "Traceback ...\n[rank0]: RuntimeError: [lm_head.weight] has no gradient"
    render_measurement({"status": "error", "error": error, "ranks": [], "estimate": {"per_gpu": {"total": 1}}}, console)
    assert "[rank0]: RuntimeError: [lm_head.weight] has no gradient" in console.export_text()


def test_an_estimates_title_and_verdict_print_with_their_brackets() -> None:
    work = Workload(load_builtin_model("gpt2"), ClusterSpec(gpu_memory=2**20), TrainSpec(seq_len=1024))
    est = estimate(work, TrialConfig({"zero_optimization": {"stage": 0}}))
    console = Console(record=True, width=400)
    render(est, "models/[exp1]/config.json", console)
    text = console.export_text()
    assert "models/[exp1]/config.json" in text and "DOES NOT FIT" in text


def test_a_runs_memory_reads_in_the_budgets_unit() -> None:
    """``dstune measure --gpu-memory 64MiB`` printed its peaks as 0.04 GiB: under a budget below 1 GiB the ranks'
    peaks and the estimate read in MiB, as the study table's do; above it, GiB as before."""
    rank = {"rank": 0, "status": "ok", "peak_bytes": 42 * 2**20, "peak_rss_bytes": 900 * 2**20}
    result = {"status": "error", "error": None, "ranks": [rank], "estimate": {"per_gpu": {"total": 40 * 2**20}}}
    expected = {
        2**26: ("peak MiB", "42.0", "900.0", "estimated peak per GPU: 40.0 MiB"),
        80 * 2**30: ("peak GiB", "0.04", "0.88", "estimated peak per GPU: 0.04 GiB"),
    }
    for budget, figures in expected.items():
        console = Console(record=True, width=200)
        render_measurement(result, console, budget=budget)
        text = console.export_text()
        assert all(figure in text for figure in figures), text


def test_an_estimate_reads_in_its_budgets_unit() -> None:
    """``dstune estimate --gpu-memory 64MiB`` printed 0.00-0.01 GiB for most categories and "0.04 GiB headroom (of
    0.06 GiB)": under a budget below 1 GiB its GPU figures read in MiB; the CPU's follow the CPU memory's budget."""
    work = Workload(load_builtin_model("tiny-llama"), ClusterSpec(2, gpu_memory=2**26, device="cpu"), TrainSpec(128))
    est = estimate(work, TrialConfig({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 0}}))
    console = Console(record=True, width=200)
    render(est, "tiny-llama", console)
    text = console.export_text()
    assert est.fits and f"FITS with {est.headroom / 2**20:.1f} MiB headroom per GPU (of 64.0 MiB)" in text
    assert f"total            │ {est.gpu_total / 2**20:.1f}" in text and "GiB of 1024.00 GiB" in text
