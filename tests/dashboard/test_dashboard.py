"""The dashboard: routes through FastAPI's TestClient, then the real pages in a headless chromium (Selenium).

The database is seeded through the real Store API with real DeepSpeed configs and real estimates.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("jinja2")

from browser import chrome, serve, severe_logs
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tuner.dashboard import router
from tuner.dashboard._views import chart_data, describe_config, estimate_quality, pareto_front, throughput_accuracy
from tuner.estimator import estimate
from tuner.forecast import throughput_summary
from tuner.requests import JobRequest
from tuner.space.dsconfig import shortcut_config, validate_with_deepspeed
from tuner.storage import Store
from tuner.units import GiB
from tuner.workload import ClusterSpec, TrainSpec, Workload, load_builtin_model

STUDY = "gpt2-search"
ODD_STUDY = "team/gpt2 v2"  # a slash and a space: links must quote it
WORLD_SIZE = 2
BEST_TOKENS = 61234.5

# (number, ds_config shortcut args, status, tokens/s or prune reason, measured/estimated peak ratio)
TRIALS = [
    (0, (4, 2, "bf16", 2, "none", "none"), "ok", 50210.0, 1.05),
    (1, (8, 1, "bf16", 3, "none", "none"), "ok", BEST_TOKENS, 0.97),
    (2, (16, 1, "bf16", 1, "none", "none"), "pruned", "GPU memory short by 1234567 bytes at the backward phase", None),
    (3, (8, 1, "bf16", 0, "none", "none"), "oom", None, 1.30),
    (4, (2, 4, "bf16", 2, "cpu", "none"), "ok", 42000.0, 1.10),
    (5, (32, 1, "bf16", 0, "none", "none"), "pruned", "GPU memory short by 9876543 bytes at the forward phase", None),
    (6, (1, 8, "bf16", 1, "none", "none"), "ok", 38000.0, 1.02),
]
# the throughput model's tokens/s, as the loop records it with each trial's estimate
PREDICTED = {0: 45000.0, 1: 70000.0, 2: 80000.0, 3: 30000.0, 4: 52000.0, 5: 90000.0, 6: 30000.0}


def rank_report(peak: int) -> list[dict]:
    """Trial 0's rank report: one rank on each of two Ray nodes, as ``Measurement.to_dict()`` stores it."""
    return [
        {
            "rank": rank,
            "node_id": node,
            "hostname": f"gpu-{rank}",
            "node_rank": rank,
            "local_rank": 0,
            "status": "ok",
            "peak_bytes": peak - 1000 * (1 - rank),
            "peak_rss_bytes": (3 + rank) * GiB,
            "step_times": [0.25, 0.5 + rank],
        }
        for rank, node in enumerate(("a1" * 28, "b2" * 28))
    ]


def _workload() -> Workload:
    return Workload(
        load_builtin_model("gpt2"), ClusterSpec(gpus_per_node=WORLD_SIZE, gpu_memory=24 * GiB), TrainSpec(1024)
    )


def recorded(workload: Workload, config: dict, predicted_tokens_per_s: float) -> dict:
    """A trial's stored estimate as the loop records it: the memory estimate plus the throughput prediction."""
    prediction = {**throughput_summary(workload, config), "tokens_per_s": predicted_tokens_per_s}
    return {**estimate(workload, config).to_dict(), "throughput": prediction}


def seed(store: Store) -> None:
    """A study with ok, oom, pruned and infeasible trials, and a second (oddly named) study of the same workload whose
    trial predates stored throughput predictions."""
    workload = _workload()
    workload_id = store.upsert_workload(workload)
    study = store.get_or_create_study(STUDY, workload_id, sampler="tpe", settings={"global_batch": 16})
    for number, args, status, value, ratio in TRIALS:
        config = shortcut_config(*args)
        est = recorded(workload, config, PREDICTED[number])
        key = json.dumps(config, sort_keys=True)
        if status == "pruned":
            store.add_trial(study.id, number, key, config, {"stage": args[3]}, False, est, "pruned", value, 1.0)
            continue
        trial_id = store.add_trial(study.id, number, key, config, {"stage": args[3]}, False, est)
        store.start_trial(trial_id, hardware="test-gpu")
        peak = int(est["per_gpu"]["total"] * ratio)
        measurement = {
            "status": status,
            "tokens_per_s": value,
            "peak_bytes_per_rank": [peak - 1000, peak],
            "error": "CUDA out of memory" if status == "oom" else None,
            "ranks": rank_report(peak) if number == 0 else [],
        }
        if number == 0:
            measurement["cost"] = {"imports_s": 3.0, "initialize_s": 6.0, "timed_s": 1.5, "wall_s": 12.0}
            measurement["cost"].update(overhead_s=10.5, other_s=1.5)
            measurement["breakdown"] = {"forward_s": 0.125, "backward_s": 0.25, "step_s": 0.0625}
            measurement["stopped_early"] = True
        store.finish_trial(trial_id, status, measurement)
    store.add_infeasible(study.id, 7, {"stage": 3, "micro_batch": 64}, "global batch 16 is not divisible by 128")
    store.set_study_status(study.id, "finished")

    seed_jobs(store)

    odd = store.get_or_create_study(ODD_STUDY, workload_id, sampler="random", settings={})
    config = shortcut_config(2, 4, "bf16", 1, "none", "none")
    trial_id = store.add_trial(odd.id, 0, "k0", config, None, False, estimate(workload, config))
    store.start_trial(trial_id)
    store.finish_trial(trial_id, "ok", {"tokens_per_s": 1000.0, "peak_bytes_per_rank": [3 * GiB]})


def seed_jobs(store: Store) -> None:
    """Three tuning jobs as workers leave them: one done (its study is STUDY), one failed, one still queued."""

    def request(model: str, trials: int) -> dict:
        body = {"workload": {"model": model, "gpus": WORLD_SIZE, "seq_len": 1024}, "trials": trials}
        return JobRequest.model_validate(body).model_dump(mode="json")

    done = store.enqueue_job(STUDY, request("gpt2", 12))
    failed = store.enqueue_job("llama-night", request("llama-2-7b", 40))
    store.enqueue_job("queued-night", request("mistral-7b", 30))
    for job in (done, failed):
        assert store.claim_next_job("host-a:123:1").id == job.id
    store.update_job_progress(done.id, {"trials": 12, "budget": 12, "best_tokens_per_s": BEST_TOKENS})
    store.finish_job(done.id, "done")
    store.update_job_progress(failed.id, {"trials": 3, "budget": 40})
    store.finish_job(failed.id, "failed", "Ray job dstune-job-2-ab12 ended FAILED (exit code 1)")


def make_app(url: str) -> FastAPI:
    app = FastAPI()
    app.state.store = Store.open(url)
    app.include_router(router)
    return app


@pytest.fixture(scope="module")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('dashboard')}/dstune.db"
    with Store.open(url) as store:
        seed(store)
    return url


@pytest.fixture(scope="module")
def app(db_url: str) -> FastAPI:
    app = make_app(db_url)
    yield app
    app.state.store.close()


@pytest.fixture(scope="module")
def client(app: FastAPI) -> TestClient:
    return TestClient(app)


# ------------------------------------------------------------------------------------------------------------ routes


def test_home_lists_workload_with_best_throughput(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "gpt2" in page
    assert "61,234" in page  # the best over both studies is trial 1 of STUDY
    assert "ZeRO-3 · micro 8 × accum 1 · bf16" in page
    assert f'href="/studies/{quote(ODD_STUDY, safe="")}"' in page
    assert "/static/dashboard.css" in page


def test_home_lists_jobs_with_status_and_progress(client: TestClient) -> None:
    page = client.get("/").text
    jobs = page[page.index('id="jobs"') :]
    assert jobs.index('data-job="3"') < jobs.index('data-job="2"') < jobs.index('data-job="1"')  # newest first
    assert f'<a href="/studies/{STUDY}">{STUDY}</a>' in jobs  # a job whose study exists links to it
    assert '<span class="badge s-done">done</span>' in jobs and "12 / 12" in jobs and "61,234" in jobs
    assert "s-failed" in jobs and "3 / 40" in jobs and "ended FAILED (exit code 1)" in jobs
    assert '<span class="badge s-queued">queued</span>' in jobs and "0 / 30" in jobs and "mistral-7b" in jobs
    assert 'href="/studies/queued-night"' not in jobs  # no study yet: no dead link
    assert '<meta http-equiv="refresh" content="30">' in page  # a job is queued: the page follows it


def test_home_without_studies(tmp_path: Path) -> None:
    app = make_app(f"sqlite:///{tmp_path}/empty.db")
    try:
        response = TestClient(app).get("/")
    finally:
        app.state.store.close()
    assert response.status_code == 200
    assert "No studies yet" in response.text and "No tuning jobs queued" in response.text
    assert 'http-equiv="refresh"' not in response.text  # nothing to follow: no reload


def test_study_page(client: TestClient) -> None:
    response = client.get(f"/studies/{STUDY}")
    assert response.status_code == 200
    page = response.text
    for chart in ("chart-progress", "chart-pareto", "chart-estimate", "chart-throughput", "chart-reasons"):
        assert f'id="{chart}"' in page
    table = page[page.index('id="trials"') :]
    assert table.count("<tr>") == 1 + len(TRIALS) + 1  # header, the trials, the infeasible one
    assert "GPU memory short by 1.2 MiB at the backward phase" in page  # an older reason's bytes, for people
    assert "/static/chart.umd.js" in page
    assert "cdn" not in page.lower() and "https://" not in page  # nothing from the internet


def test_study_page_compares_predicted_and_measured_throughput(client: TestClient) -> None:
    """The measured trials (ok, with a throughput) by number, each with its prediction and signed error; the summary:
    median |error| of (10.4, 14.3, 23.8, 21.1)% and Spearman 0.8 (predicted ranks trials 0 and 4 the other way)."""
    page = client.get(f"/studies/{STUDY}").text
    card = " ".join(page[page.index('id="throughput-accuracy"') : page.index('id="chart-progress"')].split())
    assert "17.7% <small>median error" in card and "4 measured trials compared (1 stopped early);" in card
    assert "Spearman rank correlation 0.80" in card
    table = page[page.index('id="throughput"') : page.index('id="trials"')]
    rows = table.split("<tr data-trial=")[1:]
    assert [row.split('"')[1] for row in rows] == ["0", "1", "4", "6"]  # no oom, no pruned trial
    expected = [
        ("45,000", "50,210", "-10.4%"),
        ("70,000", "61,234", "+14.3%"),
        ("52,000", "42,000", "+23.8%"),
        ("30,000", "38,000", "-21.1%"),
    ]
    for row, (predicted, measured, error) in zip(rows, expected, strict=True):
        assert f">{predicted}</td>" in row and f">{measured}</td>" in row and f">{error}</td>" in row
    assert "stopped early" in rows[0] and all("stopped early" not in row for row in rows[1:])


def test_study_page_without_throughput_predictions(client: TestClient) -> None:
    page = client.get(f"/studies/{quote(ODD_STUDY, safe='')}").text
    assert "No measured trial has a recorded throughput prediction yet." in page
    assert 'id="throughput"' not in page and 'id="chart-throughput"' in page  # the chart says it has nothing


def test_trial_page_shows_the_rank_report(client: TestClient) -> None:
    page = client.get(f"/studies/{STUDY}").text
    assert f'<a href="/studies/{STUDY}/trials/0">0</a>' in page
    response = client.get(f"/studies/{STUDY}/trials/0")
    assert response.status_code == 200
    table = response.text[response.text.index('id="ranks"') :]
    assert table.count("<tr data-rank=") == 2
    assert 'title="' + "a1" * 28 + '">' + "a1" * 6 + "</td>" in table and "gpu-1" in table
    assert "3.00 GiB" in table and "4.00 GiB" in table and "0.25, 1.5" in table
    cost = response.text[response.text.index('id="cost"') :]
    assert "overhead beyond the timed steps\n      10.50 s" in response.text
    assert '<td>deepspeed.initialize</td><td class="num">6.00</td>' in cost and "50%" in cost
    assert cost.index("Imports") < cost.index("deepspeed.initialize") < cost.index("Timed steps")
    split = response.text[response.text.index('id="breakdown"') :]
    assert "0.125" in split and "0.250" in split and "0.062" in split
    assert 'id="stopped-early"' in response.text
    unmeasured = client.get(f"/studies/{STUDY}/trials/2").text  # pruned: no ranks
    assert "No cost report" in unmeasured and 'id="stopped-early"' not in unmeasured
    assert "No rank report" in unmeasured and "GPU memory short by 1234567 bytes" in unmeasured
    assert client.get(f"/studies/{STUDY}/trials/99").status_code == 404


def test_study_page_with_slash_in_name(client: TestClient) -> None:
    response = client.get(f"/studies/{quote(ODD_STUDY, safe='')}")
    assert response.status_code == 200
    assert "1,000" in response.text


def test_unknown_study_is_404(client: TestClient) -> None:
    response = client.get("/studies/no-such-study")
    assert response.status_code == 404
    assert "no study called" in response.text
    assert client.get("/studies/no-such-study/trials/0/ds_config.json").status_code == 404


@pytest.mark.parametrize("name", ["%00", "bad%01name", "x" * 300])
def test_a_name_no_study_can_have_is_404_on_each_backend(url: str, name: str) -> None:
    """A NUL (PostgreSQL refuses it in a query), a control character or a name longer than the column never reaches
    the database: the not-found page, on SQLite and PostgreSQL alike, with or without a trial path."""
    app = make_app(url)
    try:
        client = TestClient(app)
        for path in (f"/studies/{name}", f"/studies/{name}/trials/0", f"/studies/{name}/trials/0/ds_config.json"):
            response = client.get(path)
            assert response.status_code == 404, (path, response.text[:200])
    finally:
        app.state.store.close()


def test_download_ds_config(client: TestClient, app: FastAPI) -> None:
    response = client.get(f"/studies/{STUDY}/trials/1/ds_config.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-disposition"].startswith("attachment;")
    assert "trial1.json" in response.headers["content-disposition"]
    config = response.json()
    assert config == shortcut_config(8, 1, "bf16", 3, "none", "none")
    validate_with_deepspeed(config, WORLD_SIZE)


def test_download_missing_or_empty_trial_is_404(client: TestClient) -> None:
    assert client.get(f"/studies/{STUDY}/trials/99/ds_config.json").status_code == 404
    response = client.get(f"/studies/{STUDY}/trials/7/ds_config.json")  # infeasible: no ds_config at all
    assert response.status_code == 404
    assert "no ds_config" in response.text
    odd = client.get(f"/studies/{quote(ODD_STUDY, safe='')}/trials/0/ds_config.json")
    assert odd.status_code == 200
    assert odd.json()["zero_optimization"]["stage"] == 1


def test_static_assets(client: TestClient) -> None:
    for name, kind in (("chart.umd.js", "text/javascript"), ("dashboard.js", "text/javascript")):
        response = client.get(f"/static/{name}")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith(kind)
    assert client.get("/static/dashboard.css").headers["content-type"].startswith("text/css")
    assert "MIT" in client.get("/static/chart.js.LICENSE.md").text
    assert client.get("/static/nope.js").status_code == 404
    assert client.get("/static/..%2F_routes.py").status_code == 404


# ------------------------------------------------------------------------------------------------------------- views


def test_pareto_front_keeps_only_undominated_points() -> None:
    points = [(2.0, 10.0, 0), (1.0, 5.0, 1), (3.0, 8.0, 2), (1.5, 5.0, 3), (4.0, 12.0, 4)]
    assert pareto_front(points) == [(1.0, 5.0, 1), (2.0, 10.0, 0), (4.0, 12.0, 4)]
    assert pareto_front([]) == []


def test_reason_chart_groups_new_and_old_reasons_by_kind() -> None:
    """The store's summary templates numbers as N; new sentences and older raw-byte texts of one kind share a bar."""
    old = "gpu: estimated peak N B × (N + margin N) exceeds N B by N B at the backward phase; largest category buffers"
    reasons = {
        "needs N GiB of N MiB GPU memory at the backward phase (N% margin included); largest: buffers N GiB": 3,
        old: 1,
        "needs N GiB of N GiB node CPU memory at the step phase; largest: optimizer states N GiB": 1,
    }
    data = chart_data([], reasons, GiB)
    assert data["reasons"]["labels"] == ["GPU memory · backward · buffers", "node CPU memory · step · optimizer states"]
    assert data["reasons"]["counts"] == [4, 1]


def test_chart_data_and_estimate_quality(app: FastAPI) -> None:
    store: Store = app.state.store
    study = store.get_study(STUDY)
    trials = store.trials(study.id)
    summary = store.study_summary(study.id)
    data = chart_data(trials, summary.pruned_reasons, 24 * GiB)
    assert [p["y"] for p in data["progress"]["best"]] == [50210.0] + [BEST_TOKENS] * 7
    assert len(data["pareto"]["trials"]) == 4
    assert max(p["y"] for p in data["pareto"]["front"]) == BEST_TOKENS
    assert {p["status"] for p in data["estimate"]["trials"]} == {"ok", "oom"}
    assert sum(data["reasons"]["counts"]) == 3
    # older stored reasons (raw bytes) still group by kind: memory · phase
    assert data["reasons"]["labels"] == [
        "GPU memory · backward",
        "GPU memory · forward",
        "global batch 16 is not divisible by 128",
    ]
    assert [(p["n"], p["x"], p["y"], p["stopped_early"]) for p in data["throughput"]["trials"]] == [
        (0, 45000.0, 50210.0, True),
        (1, 70000.0, BEST_TOKENS, False),
        (4, 52000.0, 42000.0, False),
        (6, 30000.0, 38000.0, False),
    ]
    accuracy = throughput_accuracy(trials)
    assert accuracy.summary.runs == 4 and accuracy.summary.spearman == pytest.approx(0.8)
    assert accuracy.summary.median_error == pytest.approx((70000 / BEST_TOKENS - 1 + 1 - 30000 / 38000) / 2)
    assert [round(r.error, 3) for r in accuracy.rows] == [-0.104, 0.143, 0.238, -0.211]
    quality = estimate_quality(trials)
    assert quality["compared"] == 5
    assert quality["missed_ooms"] == [3]  # the estimate said it fits; it ran out of memory
    assert describe_config({}) == "(no ds_config)"
    assert describe_config(shortcut_config(2, 4, "fp16", 3, "cpu", "nvme")) == (
        "ZeRO-3 · micro 2 × accum 4 · fp16 · optimizer → cpu · params → nvme"
    )


# ----------------------------------------------------------------------------------------------------------- browser


@pytest.fixture(scope="module")
def live(app: FastAPI) -> str:
    with serve(app) as url:
        yield url


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def driver(downloads: Path):
    with chrome(download_dir=str(downloads)) as driver:
        driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
        yield driver


def _wait(condition, timeout: float = 15.0, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {message}")


def _open_study(driver, live: str) -> None:
    driver.get(f"{live}/studies/{STUDY}")
    _wait(lambda: driver.execute_script("return window.dstuneCharts !== undefined"), message="charts")


def test_browser_home(driver, live: str) -> None:
    from selenium.webdriver.common.by import By

    severe_logs(driver)  # drop anything earlier
    driver.get(f"{live}/")
    assert driver.title == "dstune"
    best = driver.find_element(By.CSS_SELECTOR, "#workloads .best-throughput").text
    assert best == "61,234"
    statuses = [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, "#jobs .badge")]
    assert statuses == ["queued", "failed", "done"]
    assert severe_logs(driver) == []


def test_browser_study_page_draws_every_chart(driver, live: str) -> None:
    severe_logs(driver)
    _open_study(driver, live)
    assert severe_logs(driver) == [], "console errors on the study page"
    drawn = driver.execute_script("return Object.keys(window.dstuneCharts).filter(k => window.dstuneCharts[k]).sort()")
    assert drawn == ["estimate", "pareto", "progress", "reasons", "throughput"]
    for name in drawn:
        state = driver.execute_script(
            """
            const canvas = document.getElementById('chart-' + arguments[0]);
            const blank = document.createElement('canvas');
            blank.width = canvas.width; blank.height = canvas.height;
            return {w: canvas.width, h: canvas.height,
                    data: canvas.toDataURL().length, blank: blank.toDataURL().length};
            """,
            name,
        )
        assert state["w"] > 100 and state["h"] > 100, f"{name}: canvas has no size"
        assert state["data"] > state["blank"] + 2000, f"{name}: canvas is blank"


def test_browser_table_sorts_on_header_click(driver, live: str) -> None:
    from selenium.webdriver.common.by import By

    _open_study(driver, live)
    header = driver.find_element(By.XPATH, "//table[@id='trials']//th[normalize-space()='Tokens/s']")

    def numbers() -> list[str]:
        return [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#trials tbody tr td:first-child")]

    assert numbers() == [str(n) for n in range(8)]
    header.click()
    assert header.get_attribute("aria-sort") == "ascending"
    ascending = numbers()
    assert ascending[:4] == ["6", "4", "0", "1"]  # 38000, 42000, 50210, 61234.5; trials without throughput last
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    assert numbers()[:4] == ["1", "0", "4", "6"]
    status = driver.find_element(By.XPATH, "//table[@id='trials']//th[normalize-space()='Status']")
    status.click()
    statuses = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#trials tbody tr td:nth-child(2)")]
    assert statuses == sorted(statuses)
    assert severe_logs(driver) == []


def test_browser_downloads_valid_ds_config(driver, live: str, downloads: Path) -> None:
    from selenium.webdriver.common.by import By

    _open_study(driver, live)
    driver.find_element(By.ID, "best-download").click()
    path = _wait(
        lambda: next((p for p in downloads.glob("*.json") if p.stat().st_size > 0), None),
        message="the ds_config download",
    )
    time.sleep(0.2)  # let chromium finish renaming the partial file
    config = json.loads(path.read_text())
    assert config["zero_optimization"]["stage"] == 3
    validate_with_deepspeed(config, WORLD_SIZE)
    assert severe_logs(driver) == []


def test_the_open_pages_show_no_command_lines_or_paths_of_an_error(tmp_path: Path) -> None:
    app = make_app(f"sqlite:///{tmp_path}/errors.db")
    store: Store = app.state.store
    try:
        body = {"workload": {"model": "gpt2", "gpus": WORLD_SIZE, "seq_len": 1024}, "trials": 2}
        job = store.enqueue_job("oom-night", JobRequest.model_validate(body).model_dump(mode="json"))
        store.claim_next_job("host-a:1:1")
        listing = "4242\t7.70\t/usr/bin/python -m other_user.train --api-key abc /home/other/secret.yaml"
        store.finish_job(job.id, "failed", f"Task was killed due to the node running low on memory.\n{listing}")
        response = TestClient(app).get("/")
    finally:
        store.close()
    assert response.status_code == 200 and "running low on memory" in response.text
    assert "/home/other" not in response.text and "other_user.train" not in response.text
