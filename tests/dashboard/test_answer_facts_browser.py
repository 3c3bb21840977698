"""In a headless chromium, the study page of a study allowed numerics-changing choices whose winner was confirmed:
the page says the study searched them, names the winner's choices and that they change the numerics, and shows the
confirmation (its badge and line), with no console error."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser import chrome, serve, severe_logs
from fastapi import FastAPI

from tests.api.test_answer_facts import seed
from tuner.dashboard import router
from tuner.storage import Store
from tuner.study import Confirmation


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = f"sqlite:///{tmp_path_factory.mktemp('facts') / 'dstune.db'}"
    seed(db, script=True, confirmed=Confirmation(0, "ok", 700.0, 1000.0))
    store = Store.open(db)
    app = FastAPI()
    app.state.store = store
    app.include_router(router)
    try:
        with serve(app) as url:
            yield url
    finally:
        store.close()


def test_browser_study_page_shows_the_numerics_choices_and_the_confirmation(live: str) -> None:
    from selenium.webdriver.common.by import By

    with chrome() as driver:
        severe_logs(driver)
        driver.get(f"{live}/studies/bf16")
        assert driver.find_element(By.ID, "numerics-allowed").is_displayed()
        notes = [element.text for element in driver.find_elements(By.CSS_SELECTOR, "p.numerics-note")]
        assert any("changes the numerics against fp32-master Adam: bf16 master weights" in note for note in notes)
        confirmation = driver.find_element(By.ID, "confirmation")
        assert confirmation.is_displayed()
        assert confirmation.find_element(By.CSS_SELECTOR, ".badge").text == "not confirmed"
        assert "an independent run measured 700 tokens/s, 0.70× the trial's 1,000" in confirmation.text
        code_paths = driver.find_element(By.ID, "script-code-paths").text
        assert (
            code_paths == "your command's model ran DeepSpeed's chunked cross-entropy loss, not Liger-Kernel's kernels"
        )
        assert severe_logs(driver) == []
