"""Fixtures of the web page tests: an app on a temporary SQLite database, a real uvicorn server
on a free local port, and headless Chromium driven by Selenium.

The browser tests need Debian's ``chromium`` and ``chromium-driver`` packages (binaries
/usr/bin/chromium and /usr/bin/chromedriver, or the paths in PLANNER_TEST_CHROMIUM and
PLANNER_TEST_CHROMEDRIVER) and the ``selenium`` package; without them they are skipped with the
reason.  Screenshots go to the test's tmp_path and, when PLANNER_TEST_SCREENSHOT_DIR is set,
are copied there too.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from planner_service.api import create_app
from planner_service.settings import ServiceSettings

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1800",
)
INSTALL_HINT = "apt-get install -y chromium chromium-driver"


def _executable(env_var: str, default: str, name: str) -> str | None:
    path = os.environ.get(env_var) or (default if os.path.exists(default) else shutil.which(name))
    return path if path and os.access(path, os.X_OK) else None


@pytest.fixture
def web_client(tmp_path) -> Iterator:
    """A TestClient on a fresh SQLite database, no job worker."""
    from fastapi.testclient import TestClient

    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'web.db'}")
    with TestClient(create_app(settings, start_worker=False), raise_server_exceptions=False) as client:
        yield client


class LiveServer:
    """uvicorn serving ``create_app`` in a thread, on a socket bound before it starts (no port
    race)."""

    def __init__(self, db_path: Path, **settings_overrides) -> None:
        import uvicorn

        settings = ServiceSettings(database_url=f"sqlite:///{db_path}", worker_poll_interval_s=0.05, **settings_overrides)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(settings), log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout_s: float = 15.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the uvicorn server thread exited during start-up")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the uvicorn server did not start within {timeout_s} s")
            self.thread.join(0.02)
        httpx.get(self.base + "/readyz", timeout=5).raise_for_status()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


@pytest.fixture(scope="module")
def live_server(tmp_path_factory) -> Iterator[LiveServer]:
    server = LiveServer(tmp_path_factory.mktemp("web-live") / "planner.db")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def short_budget_server(tmp_path_factory) -> Iterator[LiveServer]:
    """A live server whose solver stops after 0.05 s, so that a hard case is left FEASIBLE."""
    server = LiveServer(tmp_path_factory.mktemp("web-short") / "planner.db", solver_time_limit_s=0.05)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium (a fresh profile) through chromedriver; skipped when absent."""
    chromium = _executable("PLANNER_TEST_CHROMIUM", "/usr/bin/chromium", "chromium")
    chromedriver = _executable("PLANNER_TEST_CHROMEDRIVER", "/usr/bin/chromedriver", "chromedriver")
    if chromium is None or chromedriver is None:
        pytest.skip(f"browser tests need chromium and chromedriver ({INSTALL_HINT})")
    webdriver = pytest.importorskip("selenium.webdriver", reason="browser tests need the selenium package (pip install -e '.[test]')")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    # Both paths are given, so Selenium Manager has nothing to download; keep it offline anyway.
    previous = os.environ.get("SE_OFFLINE")
    os.environ["SE_OFFLINE"] = "true"
    profile = tmp_path_factory.mktemp("chromium-profile")
    options = Options()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    log = tmp_path_factory.mktemp("chromedriver-log") / "chromedriver.log"
    try:
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver, log_output=str(log)), options=options)
    finally:
        if previous is None:
            os.environ.pop("SE_OFFLINE", None)
        else:
            os.environ["SE_OFFLINE"] = previous
    driver.set_page_load_timeout(20)
    driver.set_script_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def screenshot(tmp_path):
    """``screenshot(driver, name)`` → path of a PNG of the whole page (also copied to
    PLANNER_TEST_SCREENSHOT_DIR when set)."""

    def take(driver, name: str) -> Path:
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1280, max(900, min(int(height) + 40, 6000)))
        path = tmp_path / f"{name}.png"
        assert driver.save_screenshot(str(path)), "the screenshot could not be saved"
        out_dir = os.environ.get("PLANNER_TEST_SCREENSHOT_DIR")
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(out_dir) / path.name)
        driver.set_window_size(1280, 1800)
        return path

    return take


@pytest.fixture
def view_screenshot(tmp_path):
    """``view_screenshot(element, name)`` → path of a PNG of one element (one view of the
    page), kept under the test's tmp_path and copied to PLANNER_TEST_SCREENSHOT_DIR when set."""

    def take(element, name: str) -> Path:
        element.parent.execute_script("arguments[0].scrollIntoView({block: 'start'})", element)
        path = tmp_path / f"{name}.png"
        assert element.screenshot(str(path)), "the screenshot could not be saved"
        out_dir = os.environ.get("PLANNER_TEST_SCREENSHOT_DIR")
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(out_dir) / path.name)
        return path

    return take
