"""The home page tells workloads apart as a user needs to: the same model and cluster in two launch environments are
two rows that say which is which, and the lengths of one ``dstune tune --seq-len max`` search are one search (its
lengths in order, how each run ended, the longest that trained), not unrelated workloads. Then, in a headless
chromium, the study page's charts: whole trial numbers on the progress axis and one range on both axes of the
measured-against-estimated memory chart (its diagonal from corner to corner)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from browser import chrome, serve, severe_logs
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tuner.dashboard import router
from tuner.estimator import estimate
from tuner.forecast import throughput_summary
from tuner.space.dsconfig import shortcut_config
from tuner.storage import Store
from tuner.study.length_runs import length_study_name
from tuner.units import GiB
from tuner.workload import ClusterSpec, LaunchEnv, TrainableSpec, TrainSpec, Workload, load_builtin_model

SEARCH = "tiny-lengths"
LENGTHS = {1024: ("ok", 9000.0), 2048: ("ok", 8000.0), 4096: ("oom", None)}
LAUNCHES = {"deepspeed": LaunchEnv(), "torchrun": LaunchEnv.of("torchrun", variables={"OMP_NUM_THREADS": "1"})}
TOKENS = {"deepspeed": 1504.0, "torchrun": 11285.0}


def workload(seq_len: int = 1024, launch: LaunchEnv | None = None) -> Workload:
    cluster = ClusterSpec(gpus_per_node=2, gpu_memory=GiB, device="cpu")
    return Workload(load_builtin_model("tiny-llama"), cluster, TrainSpec(seq_len), launch=launch or LaunchEnv())


def measured(store: Store, study: str, work: Workload, trials: list[tuple[str, float | None]], **settings) -> None:
    """A study of ``work`` whose trials 0, 1... ended ``(status, tokens/s)``, each a real config, estimate and
    throughput prediction."""
    record = store.get_or_create_study(study, store.upsert_workload(work), "tpe", settings)
    for number, (status, tokens) in enumerate(trials):
        config = shortcut_config(1 + number, 1, "bf16", 2, "none", "none")
        est = {**estimate(work, config).to_dict(), "throughput": throughput_summary(work, config)}
        trial_id = store.add_trial(record.id, number, f"k{number}", config, None, False, est)
        store.start_trial(trial_id)
        peak = int(est["per_gpu"]["total"] * (1.02 + 0.03 * number))
        store.finish_trial(trial_id, status, {"tokens_per_s": tokens, "peak_bytes_per_rank": [peak, peak]})


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    url = f"sqlite:///{tmp_path_factory.mktemp('apart')}/dstune.db"
    app = FastAPI()
    app.state.store = store = Store.open(url)
    app.include_router(router)
    for name, launch in LAUNCHES.items():
        trials = [("ok", TOKENS[name] * (0.5 + 0.2 * n)) for n in range(2)] + [("ok", TOKENS[name])]
        measured(store, f"launch-{name}", workload(launch=launch), trials)
    for seq_len, (status, tokens) in LENGTHS.items():  # as tune --seq-len max records each length it measures
        settings = {"seq_len_search": SEARCH, "seq_len": seq_len, "candidate": {}}
        measured(store, length_study_name(SEARCH, seq_len), workload(seq_len), [(status, tokens)], **settings)
    yield app
    store.close()


def rows(page: str, table: str) -> list[str]:
    body = page[page.index(f'id="{table}"') :]
    body = body[: body.index("</table>")]
    return body.split("<tr")[2:]  # past the header


def test_workloads_differing_only_by_launch_environment_are_told_apart(app: FastAPI) -> None:
    page = TestClient(app).get("/").text
    workloads = rows(page, "workloads")
    assert len(workloads) == 2
    (plain,) = [row for row in workloads if "1,504" in row]
    (torchrun,) = [row for row in workloads if "11,285" in row]
    assert "launch torchrun" in torchrun and "sets OMP_NUM_THREADS" in torchrun and "launch " not in plain
    assert "OMP_NUM_THREADS=1" not in page  # the variables' values are the API token holder's
    fingerprints = {workload(launch=launch).fingerprint()[:8] for launch in LAUNCHES.values()}
    assert all(any(f in row for f in fingerprints) for row in workloads) and len(fingerprints) == 2


def test_a_length_search_is_one_search_with_its_lengths_in_order(app: FastAPI) -> None:
    page = TestClient(app).get("/").text
    assert not any(SEARCH in row for row in rows(page, "workloads"))
    (search,) = rows(page, "length-searches")
    assert search.index("1,024") < search.index("2,048") < search.index("4,096")
    assert search.count("s-ok") == 2 and search.count("s-oom") == 1
    assert 'class="num longest">2,048<' in search and "8,000" in search  # the longest that trained, its speed
    assert f'href="/studies/{SEARCH}%3A4096"' in search and " · seq " not in search


def test_a_length_studys_page_names_its_search_and_its_other_lengths(app: FastAPI) -> None:
    """The page of one length (``tiny-lengths:2048``) read as a study of its own: it names its search, links the
    other lengths with how each ended, and says the longest that trained."""
    page = TestClient(app).get(f"/studies/{SEARCH}%3A2048").text
    said = page[page.index('id="length-search"') :].split("</p>")[0]
    assert f"search {SEARCH}," in said and "<strong>2,048</strong>" in said
    assert f'href="/studies/{SEARCH}%3A1024">1,024</a>' in said and f'href="/studies/{SEARCH}%3A4096">4,096</a>' in said
    assert said.count("s-ok") == 2 and said.count("s-oom") == 1 and "the longest that trained: 2,048 tokens" in said
    assert 'id="length-search"' not in TestClient(app).get("/studies/launch-torchrun").text


def test_only_a_length_search_is_not_an_empty_home(tmp_path: Path) -> None:
    app = FastAPI()
    app.state.store = store = Store.open(f"sqlite:///{tmp_path}/one.db")
    app.include_router(router)
    try:
        settings = {"seq_len_search": SEARCH, "seq_len": 1024, "candidate": {}}
        measured(store, length_study_name(SEARCH, 1024), workload(1024), [("ok", 9000.0)], **settings)
        page = TestClient(app).get("/").text
    finally:
        store.close()
    assert "No studies yet" not in page and 'id="length-searches"' in page and 'id="workloads"' not in page


# ----------------------------------------------------------------------------------------------------------- browser


@pytest.fixture(scope="module")
def live(app: FastAPI) -> str:
    with serve(app) as url:
        yield url


@pytest.fixture(scope="module")
def driver():
    with chrome() as driver:
        yield driver


def charts(driver, live: str, study: str) -> None:
    driver.get(f"{live}/studies/{study}")
    deadline = time.monotonic() + 15
    while not driver.execute_script("return window.dstuneCharts !== undefined"):
        assert time.monotonic() < deadline, "charts not drawn"
        time.sleep(0.1)


def test_browser_trial_ticks_are_whole_numbers_and_the_memory_axes_share_one_range(driver, live: str) -> None:
    severe_logs(driver)
    charts(driver, live, "launch-torchrun")  # trials 0-2: Chart.js would tick the progress axis at 0.2, 0.4...
    ticks = driver.execute_script("return window.dstuneCharts.progress.scales.x.ticks.map(t => t.value)")
    assert len(ticks) > 2 and all(float(tick).is_integer() for tick in ticks), ticks
    for name in ("estimate", "throughput"):
        x, y = driver.execute_script(
            "const s = window.dstuneCharts[arguments[0]].scales; return [[s.x.min, s.x.max], [s.y.min, s.y.max]]",
            name,
        )
        assert x == y, f"{name}: x spans {x}, y spans {y}"
    assert severe_logs(driver) == []


def test_browser_home_shows_the_length_search_and_both_launches(driver, live: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{live}/")
    lengths = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#length-searches td.lengths a")]
    assert lengths == ["1,024", "2,048", "4,096"]
    described = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#workloads tbody tr td:first-child")]
    assert len(set(described)) == 2 and sum("launch torchrun" in text for text in described) == 1


# ------------------------------------------------------------------------- rows that read alike, memory in its unit

SHAPES = {  # three workloads whose descriptions read alike: "tiny-llama ... · 2 × 1.00 GiB cpu · seq 1024"
    "two-gpus": (ClusterSpec(gpus_per_node=2, gpu_memory=GiB, device="cpu"), TrainSpec(1024)),
    "two-nodes": (ClusterSpec(gpus_per_node=1, nodes=2, gpu_memory=GiB, device="cpu"), TrainSpec(1024)),
    "adam": (ClusterSpec(gpus_per_node=2, gpu_memory=GiB, device="cpu"), TrainSpec(1024, optimizer="adam")),
}
MIB_BUDGET = 2**26  # 64 MiB: its memory figures read 0.04 GiB


def bucket_trials(store: Store) -> None:
    """A study under 64 MiB whose trials 0 and 1 read alike (ZeRO-2, micro 1) but for their reduce buckets, trial 2
    reads apart (micro 2), and trial 3 is trial 0 with activation checkpointing; measured at 40, 41, 42 and 43 MiB."""
    work = Workload(
        load_builtin_model("tiny-llama"),
        ClusterSpec(gpus_per_node=2, gpu_memory=MIB_BUDGET, device="cpu"),
        TrainSpec(64),
    )
    record = store.get_or_create_study("buckets", store.upsert_workload(work), "tpe", {})
    plain = shortcut_config(1, 1, "bf16", 2, "none", "none")
    zero = plain["zero_optimization"]
    configs = [
        {**plain, "zero_optimization": {**zero, "reduce_bucket_size": 500_000_000, "overlap_comm": True}},
        {**plain, "zero_optimization": {**zero, "reduce_bucket_size": 200_000_000, "overlap_comm": True}},
        shortcut_config(2, 1, "bf16", 2, "none", "none"),
    ]
    configs.append(configs[0])
    for number, config in enumerate(configs):
        est = {**estimate(work, config).to_dict(), "throughput": throughput_summary(work, config)}
        trial_id = store.add_trial(record.id, number, f"k{number}", config, None, number == 3, est)
        store.start_trial(trial_id)
        peak = (40 + number) * 2**20
        store.finish_trial(trial_id, "ok", {"tokens_per_s": 900.0 + number, "peak_bytes_per_rank": [peak, peak]})


@pytest.fixture(scope="module")
def alike(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    app = FastAPI()
    app.state.store = store = Store.open(f"sqlite:///{tmp_path_factory.mktemp('alike')}/dstune.db")
    app.include_router(router)
    for name, (cluster, train) in SHAPES.items():
        measured(store, name, Workload(load_builtin_model("tiny-llama"), cluster, train), [("ok", 1000.0)])
    bucket_trials(store)
    yield app
    store.close()


def test_workloads_that_read_alike_say_where_they_differ(alike: FastAPI) -> None:
    """Three workloads differing in the cluster's shape (2 GPUs or 2 nodes of 1) or the optimizer read as three
    identical rows: each now says its values of those settings; a row that reads apart says nothing more."""
    workloads = rows(TestClient(alike).get("/").text, "workloads")
    said = {}
    for row in workloads:
        differs = row.split('class="differs">')[1].split("</span>")[0] if "differs" in row else ""
        said[row.split('href="/studies/')[-1].split('"')[0]] = differs
    assert said == {
        "two-gpus": "gpus_per_node=2 · nodes=1 · optimizer=adamw",
        "two-nodes": "gpus_per_node=1 · nodes=2 · optimizer=adamw",
        "adam": "gpus_per_node=2 · nodes=1 · optimizer=adam",
        "buckets": "",  # 64.0 MiB: its description tells it apart
    }


def test_a_lora_and_a_full_fine_tuning_of_one_workload_are_told_apart(tmp_path: Path) -> None:
    """The README's LoRA study and a full fine-tuning of the same model and cluster read as the same row."""
    app = FastAPI()
    app.state.store = store = Store.open(f"sqlite:///{tmp_path}/lora.db")
    app.include_router(router)
    lora = TrainableSpec(peft=json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"]}))
    try:
        for name, trainable in (("full", TrainableSpec()), ("lora", lora)):
            study = store.get_or_create_study(
                name, store.upsert_workload(replace(workload(), trainable=trainable)), "tpe", {}
            )
            trial_id = store.add_trial(
                study.id, 0, "k0", shortcut_config(1, 1, "bf16", 2, "none", "none"), None, False, None
            )
            store.start_trial(trial_id)
            store.finish_trial(trial_id, "ok", {"tokens_per_s": 1000.0, "peak_bytes_per_rank": [2**20, 2**20]})
        page = TestClient(app).get("/").text
    finally:
        store.close()
    said = [row.split('class="differs">')[1].split("</span>")[0] for row in rows(page, "workloads")]
    assert said == [
        "trainable=all parameters",
        "peft.peft_type=LORA · peft.r=8 · peft.target_modules=[q_proj, v_proj]",
    ]


def test_trials_that_read_alike_say_where_they_differ(alike: FastAPI) -> None:
    page = TestClient(alike).get("/studies/buckets").text
    trials = rows(page, "trials")
    assert "reduce_bucket_size=5e8" in trials[0] and "reduce_bucket_size=2e8" in trials[1]
    assert "overlap_comm" not in trials[0] + trials[1]  # alike in it: the one-line config is not repeated
    assert "differs" not in trials[2]  # micro 2: its one line tells it apart
    assert "checkpointing" in trials[3] and "checkpointing" not in trials[0]  # the one line said neither


def test_the_charts_memory_reads_in_the_budget_unit(alike: FastAPI) -> None:
    """Under a 64 MiB budget the memory charts read 0.039, 0.040... GiB: they read in MiB, as the tables do."""
    page = TestClient(alike).get("/studies/buckets").text
    data = json.loads(page.split('id="chart-data">')[1].split("</script>")[0])
    assert data["memory_unit"] == "MiB"
    assert [point["y"] for point in data["estimate"]["trials"]] == [40.0, 41.0, 42.0, 43.0]
    assert sorted(point["x"] for point in data["pareto"]["trials"]) == [40.0, 41.0, 42.0, 43.0]


@pytest.fixture(scope="module")
def alike_live(alike: FastAPI) -> str:
    with serve(alike) as url:
        yield url


def test_browser_memory_axes_read_in_the_budget_unit(driver, alike_live: str) -> None:
    severe_logs(driver)
    charts(driver, alike_live, "buckets")
    titles = driver.execute_script(
        "const c = window.dstuneCharts; return [c.pareto.scales.x, c.estimate.scales.x, c.estimate.scales.y]"
        ".map(s => s.options.title.text)"
    )
    assert titles == ["Peak memory per GPU (MiB)", "Estimated peak per GPU (MiB)", "Measured peak per GPU (MiB)"]
    x, y = driver.execute_script(
        "const s = window.dstuneCharts.estimate.scales; return [[s.x.min, s.x.max], [s.y.min, s.y.max]]"
    )
    assert x == y and x[0] < 40 < 43 < x[1]
    assert severe_logs(driver) == []


def test_browser_same_range_axes_end_on_ticks_and_trial_axes_start_at_zero(driver, live: str, alike_live: str) -> None:
    """The memory and throughput diagonals' axes ended at 634.04 and 6,485.09 beside ticks at 1,000, 2,000..., and
    the y = x line stopped short of the corners: both ends are now ticks of the same step and the line goes from
    corner to corner; a study of one trial had its trial axis from -1 to 1."""
    severe_logs(driver)
    charts(driver, alike_live, "buckets")
    for name in ("estimate", "throughput"):
        spans = driver.execute_script(
            "const s = window.dstuneCharts[arguments[0]].scales; return [s.x, s.y].map(a => a.ticks.map(t => t.value))",
            name,
        )
        assert spans[0] == spans[1], name  # one range, one set of ticks
        steps = {round(b - a, 9) for a, b in zip(spans[0], spans[0][1:], strict=False)}
        assert len(spans[0]) > 2 and len(steps) == 1, (name, spans[0])
        line, corners = driver.execute_script(
            "const c = window.dstuneCharts[arguments[0]], s = c.scales, d = c.data.datasets.at(-1);"
            "return [d.data.map(p => [p.x, p.y]), [[s.x.min, s.y.min], [s.x.max, s.y.max]]]",
            name,
        )
        assert line == corners, name  # y = x from corner to corner
    charts(driver, live, f"{SEARCH}%3A2048")  # one trial, numbered 0
    ticks = driver.execute_script("return window.dstuneCharts.progress.scales.x.ticks.map(t => t.value)")
    assert min(ticks) == 0 and all(float(tick).is_integer() for tick in ticks), ticks
    assert severe_logs(driver) == []
