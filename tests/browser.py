"""Helpers for the dashboard's browser tests: a headless Debian chromium driven by Selenium, and a live server.

Selenium is pointed at ``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` (installed by ``tests/start_browser.sh``),
so Selenium Manager never downloads anything. Without a browser the tests skip locally and fail under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HEADLESS_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1800",
)


def _unavailable(reason: str) -> None:
    """Skip locally; under CI a missing browser is a failure, not a skip."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"browser tests cannot run under CI: {reason}")
    pytest.skip(reason)


def ensure_browser() -> tuple[str, str]:
    """Paths of chromium and chromedriver, installing them with ``tests/start_browser.sh`` if missing."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        result = subprocess.run(["bash", str(HERE / "start_browser.sh")], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            _unavailable(f"cannot install chromium: {result.stderr.strip()[-500:]}")
    chromium = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    driver = CHROMEDRIVER if Path(CHROMEDRIVER).exists() else shutil.which("chromedriver")
    if not chromium or not driver:
        _unavailable("chromium or chromedriver not found")
    return str(chromium), str(driver)


@contextlib.contextmanager
def chrome(download_dir: str | None = None) -> Iterator[Any]:
    """A headless Chrome WebDriver with browser console logging, quit on exit."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed")
    chromium, chromedriver = ensure_browser()
    profile = tempfile.mkdtemp(prefix="dstune-chrome-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in HEADLESS_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if download_dir is not None:
        options.add_experimental_option(
            "prefs", {"download.default_directory": download_dir, "download.prompt_for_download": False}
        )
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def severe_logs(driver: Any) -> list[dict[str, Any]]:
    """The browser console's SEVERE entries since the last call (errors, failed loads)."""
    return [entry for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on 127.0.0.1 in a background thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
