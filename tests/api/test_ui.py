"""The web UI in a real headless browser: Debian's Chromium driven by Selenium through the system
chromedriver (scripts/test.sh installs both), against a real `autopar serve` on SQLite holding a few
plans and runs. Every page must render its key elements, its charts must exist and draw pixels,
the browser console must stay free of errors, and nothing may come from outside the host: Chromium
resolves every name but 127.0.0.1 to "not found", as on an air-gapped cluster. A screenshot per page
is kept in tests/artifacts/ui/ (ignored by git) or in $AUTOPAR_TEST_ARTIFACTS."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.local_server import LocalServer
from planner.exporters import formats

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("AUTOPAR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AUTOPAR_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("AUTOPAR_TEST_ARTIFACTS", REPO / "tests" / "artifacts")) / "ui"
PROFILE: dict[str, Any] = {
    "step_times_s": [0.31, 0.22, 0.21, 0.2], "step_s": 0.21, "peak_memory_bytes_per_rank": [9.1e8, 9.3e8, 8.8e8, 9.0e8],
    "tokens_per_s": 4876.0, "mfu": 0.046, "environment": {"torch": "2.13.0", "backend": "gloo"},
}


def _browser_binaries() -> tuple[str, str]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise RuntimeError(
                f"{path} is missing: the UI test needs Debian's chromium and chromium-driver "
                "(scripts/test.sh installs them: apt-get install -y chromium chromium-driver)"
            )
    return CHROMIUM, CHROMEDRIVER


class Site:
    """A served database with plans and runs in known states, as a user and an agent made them."""

    def __init__(self, server: LocalServer) -> None:
        from api.auth import create_token
        from api.db import Database

        db = Database(server.database_url)
        self.cluster = "local-cpu"
        # a GPU plan smoke-tested on a CPU machine runs under an agent's own cluster name, neither a preset
        # nor registered: the service queues it with a note that it could not check the GPUs (`api.run_checks`)
        self.lab = "ui-lab-cpu"
        with db.write_session() as session:
            _, self.user_token = create_token(session, "ui-user", "user", None)
            _, agent_token = create_token(session, "ui-agent", "agent", self.cluster)
            _, lab_token = create_token(session, "ui-lab-agent", "agent", self.lab)
        db.dispose()
        self.url = server.url
        self.user = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {self.user_token}"}, timeout=120)
        self.agent = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {agent_token}"}, timeout=60)
        self.lab_agent = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {lab_token}"}, timeout=60)
        self.tiny = self.plan({"model": "tiny", "cluster": "local-cpu", "gpus": 4, "training": {"seq_len": 128, "global_batch": 8}})
        self.big = self.plan({
            "model": "llama3-70b", "cluster": "dgx-h100", "gpus": 64, "training": {"seq_len": 4096, "global_batch": 256},
            "constraints": {"pp": 4},
        })
        self.impossible = self.plan({
            "model": "llama3-405b", "cluster": "rtx4090-pcie-8", "gpus": 8, "training": {"seq_len": 4096, "global_batch": 64},
        })
        # a QLoRA plan for one H100, whose run reports from a CPU machine: the live-storage tracker's memory
        # is not the H100's, and the UI does not call the difference an error
        self.qlora = self.plan({
            "model": "tiny", "cluster": "dgx-h100", "gpus": 1,
            "training": {"seq_len": 128, "global_batch": 4, "method": "qlora", "lora_rank": 8},
        })
        r = self.agent.post("/v1/agents", json={"name": "ui-agent", "cluster": self.cluster, "hostname": "node-0"})
        assert r.status_code == 201, r.text
        self.agent_id = r.json()["id"]
        self.done_run = self.queue(4)
        self.lease()
        self.heartbeat(self.done_run, 2, 4)
        r = self.agent.put(f"/v1/runs/{self.done_run}/profile", json=PROFILE,
                           params={"agent_id": self.agent_id, "attempt": 1})
        assert r.status_code == 201, r.text
        r = self.agent.post(f"/v1/runs/{self.done_run}/finish", json={
            "agent_id": self.agent_id, "attempt": 1, "status": "succeeded", "log_tail": "step 4/4 loss 5.9\n", "exit_code": 0,
        })
        assert r.status_code == 200, r.text
        r = self.lab_agent.post("/v1/agents", json={"name": "ui-lab-agent", "cluster": self.lab, "hostname": "cpu-0"})
        assert r.status_code == 201, r.text
        lab_agent_id = r.json()["id"]
        r = self.user.post(f"/v1/plans/{self.qlora}/runs", json={"cluster": self.lab, "steps": 4})
        assert r.status_code == 201 and r.json()["notes"], r.text  # the GPUs could not be checked, and it says so
        self.cpu_run = int(r.json()["id"])
        r = self.lab_agent.post("/v1/runs/lease", json={"agent_id": lab_agent_id})
        assert r.status_code == 200, r.text
        one_rank = {**PROFILE, "peak_memory_bytes_per_rank": PROFILE["peak_memory_bytes_per_rank"][:1]}
        r = self.lab_agent.put(f"/v1/runs/{self.cpu_run}/profile", json={**one_rank, "memory_source": "live-storage tracker (CPU)"},
                               params={"agent_id": lab_agent_id, "attempt": 1})
        assert r.status_code == 201, r.text
        r = self.lab_agent.post(f"/v1/runs/{self.cpu_run}/finish", json={
            "agent_id": lab_agent_id, "attempt": 1, "status": "succeeded", "log_tail": "step 4/4\n", "exit_code": 0,
        })
        assert r.status_code == 200, r.text
        self.live_run = self.queue(10)
        self.lease()
        self.heartbeat(self.live_run, 2, 10)

    def plan(self, body: dict[str, Any]) -> int:
        r = self.user.post("/v1/plans", json=body)
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def queue(self, steps: int, plan: int | None = None) -> int:
        r = self.user.post(f"/v1/plans/{plan or self.tiny}/runs", json={"cluster": self.cluster, "steps": steps})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def lease(self) -> None:
        r = self.agent.post("/v1/runs/lease", json={"agent_id": self.agent_id})
        assert r.status_code == 200, r.text

    def heartbeat(self, run_id: int, step: int, steps: int) -> None:
        r = self.agent.post(f"/v1/runs/{run_id}/heartbeat", json={
            "agent_id": self.agent_id, "attempt": 1, "progress": {"step": step, "steps": steps, "loss": 6.0 - step / 10, "message": "training"},
        })
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("ui")
    server = LocalServer(f"sqlite:///{tmp / 'autopar.db'}", tmp / "server.log", cwd=REPO)
    server.start()
    try:
        yield Site(server)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = _browser_binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1800",
                 "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"):
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    driver.set_page_load_timeout(30)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"\nUI screenshots: {ARTIFACTS}")
    try:
        yield driver
    finally:
        driver.quit()


def _errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _wait(driver: Any, condition: Callable[[], Any], what: str, timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; page text:\n{driver.find_element('tag name', 'body').text[:2000]}")


def _open(driver: Any, url: str, shot: str) -> str:
    """Load a UI page, wait until it says it is drawn, check the console; returns the page text."""
    driver.get(url)
    _wait(driver, lambda: driver.execute_script("return document.body.dataset.ready === '1'"), f"{url} to render")
    text: str = driver.find_element("id", "app").text
    assert "Loading" not in text
    driver.save_screenshot(str(ARTIFACTS / f"{shot}.png"))
    assert _errors(driver) == [], f"console errors on {url}"
    assert driver.find_elements("css selector", "#app .error") == [], text
    return text


def _chart_drawn(driver: Any, canvas_id: str) -> dict[str, Any]:
    """The Chart.js instance on a canvas: its dataset sizes and whether the canvas has ink."""
    info: dict[str, Any] | None = driver.execute_script(
        """
        const canvas = document.getElementById(arguments[0]);
        if (!canvas) return null;
        const chart = Chart.getChart(canvas);
        if (!chart) return null;
        const ctx = canvas.getContext('2d');
        const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
        let ink = 0;
        for (let i = 3; i < pixels.length; i += 4) if (pixels[i] > 0) ink++;
        return {type: chart.config.type, points: chart.data.datasets.map(d => d.data.length), ink: ink,
                width: canvas.width, height: canvas.height};
        """,
        canvas_id,
    )
    assert info is not None, f"no chart on #{canvas_id}"
    assert info["width"] > 100 and info["height"] > 100, info
    assert sum(info["points"]) > 0 and info["ink"] > 1000, info
    return info


def test_pages_render_draw_charts_and_log_no_errors(site: Site, browser: Any) -> None:
    url = site.url
    text = _open(browser, f"{url}/", "01-plan-list")
    rows = browser.find_elements("css selector", "#plans tbody tr")
    assert len(rows) == 4 and "llama3-70b" in text and "no layout fits" in text
    # the CLI's units: tokens/s per GPU (the whole job's only in the sort menu, so named); the method of each plan
    headers = [th.text for th in browser.find_elements("css selector", "#plans thead th")]
    assert "tokens/s/GPU" in headers and "method" in headers and "tokens/s" not in headers
    summaries = {p["id"]: p for p in site.user.get("/v1/plans", params={"limit": 10}).json()["items"]}
    for row in rows:
        plan = summaries[int(row.find_element("css selector", "a").text.lstrip("#"))]
        cells = [td.text for td in row.find_elements("css selector", "td")]
        per_gpu = f"{plan['tokens_per_s'] / plan['gpus']:,.0f}" if plan["tokens_per_s"] else "–"
        assert cells[headers.index("tokens/s/GPU")] == per_gpu, (cells, plan)
        assert cells[headers.index("method")] == ("QLoRA" if plan["id"] == site.qlora else "full"), cells

    order = lambda: [r.find_element("css selector", "a").text for r in browser.find_elements("css selector", "#plans tbody tr")]  # noqa: E731
    by_mfu = [f"#{p['id']}" for p in site.user.get("/v1/plans", params={"sort": "-mfu"}).json()["items"]]
    browser.find_element("css selector", "a[data-sort=mfu]").click()  # sort by predicted MFU, descending
    _wait(browser, lambda: "sort=-mfu" in browser.current_url, "the sorted list")
    _open(browser, browser.current_url, "01b-plan-list-by-mfu")
    assert order() == by_mfu and by_mfu[-1] == f"#{site.impossible}"  # no MFU: last
    browser.find_element("css selector", "a[data-sort=mfu]").click()  # again: ascending
    _wait(browser, lambda: "sort=mfu" in browser.current_url, "the re-sorted list")
    _open(browser, browser.current_url, "01c-plan-list-by-mfu-ascending")
    assert order() == [*by_mfu[:-1][::-1], f"#{site.impossible}"]

    _open(browser, f"{url}/ui/plans?model=tiny&cluster=local-cpu&sort=-tokens_per_s", "02-plan-list-filtered")
    rows = browser.find_elements("css selector", "#plans tbody tr")
    assert len(rows) == 1 and "tiny" in rows[0].text

    text = _open(browser, f"{url}/ui/plans/{site.big}", "03-plan-page")
    memory = _chart_drawn(browser, "chart-memory")
    assert memory["points"][0] == 4  # one stacked bar per pipeline stage (pp pinned to 4)
    _chart_drawn(browser, "chart-time")
    pareto = _chart_drawn(browser, "chart-pareto")
    assert pareto["type"] == "scatter" and pareto["points"][0] >= 2
    links = [a.get_attribute("href") for a in browser.find_elements("css selector", "a.export")]
    assert links == [f"{url}/v1/plans/{site.big}/export/{f}" for f in formats()]
    assert "Rejected layouts" in text and "usable" in text
    # the rejections are folded away (the page was 8,833 px tall with their table open); one click opens them
    rejections = browser.find_element("id", "rejections")
    assert rejections.get_attribute("open") is None
    assert not rejections.find_element("css selector", "table").is_displayed()
    height = browser.execute_script("return document.body.scrollHeight")
    rejections.find_element("css selector", "summary").click()
    assert rejections.find_element("css selector", "table").is_displayed()
    assert browser.execute_script("return document.body.scrollHeight") > height
    assert "tokens/s/GPU" in text and "method full" in text and "MFU in brackets" in text

    text = _open(browser, f"{url}/ui/plans/{site.impossible}", "04-plan-page-no-fit")
    assert "No layout fits" in text and "Closest miss" in text and "GiB usable per GPU" in text
    assert _chart_drawn(browser, "chart-miss")["points"][0] == 1

    text = _open(browser, f"{url}/ui/plans/{site.qlora}", "05a-plan-page-qlora-cpu-run")
    assert "method QLoRA r8 nf4_double" in text and "tiny on 1 GPU of dgx-h100" in text
    # measured by the CPU tracker, predicted for an H100: not an error of the model
    assert "not compared: CPU run, H100-80GB plan" in text and "%" not in browser.find_element(
        "css selector", ".memory-not-compared").text

    text = _open(browser, f"{url}/ui/plans/{site.tiny}", "05-plan-page-measured")
    assert f"#{site.done_run}" in text and "Predicted vs measured" in text


    # the compare view, reached the way a user does: "compare with..." on a plan, tick another, press the button
    browser.find_element("link text", "compare with…").click()
    _wait(browser, lambda: f"pick={site.tiny}" in browser.current_url, "the list with the plan ticked")
    _open(browser, browser.current_url, "06-plan-list-picking")
    assert not browser.find_element("id", "compare").is_enabled()  # one plan ticked: nothing to compare yet
    for box in browser.find_elements("css selector", "input.pick"):
        assert box.is_selected() == (box.get_attribute("value") == str(site.tiny))
        if box.get_attribute("value") == str(site.big):
            box.click()
    browser.find_element("id", "compare").click()
    _wait(browser, lambda: "/ui/compare" in browser.current_url, "the compare page")
    text = _open(browser, browser.current_url, "07-compare")
    headers = browser.find_elements("css selector", "#compare-table thead th")
    assert len(headers) == 3 and "tokens/s/GPU" in text and "tokens/s (whole job)" in text and "method" in text
    for canvas in ("chart-compare-time", "chart-compare-memory"):
        assert _chart_drawn(browser, canvas)["points"][0] == 2  # one bar per plan
    assert len(_chart_drawn(browser, "chart-compare-pareto")["points"]) == 2  # one front per plan

    browser.get(f"{url}/docs")  # Swagger UI from the vendored bundle, with the outside world unresolvable
    _wait(browser, lambda: browser.find_elements("css selector", ".swagger-ui .info .title"), "Swagger UI to draw")
    assert "autopar" in browser.find_element("css selector", ".swagger-ui .info .title").text
    _wait(browser, lambda: browser.find_elements("css selector", ".opblock"), "the operations")
    browser.save_screenshot(str(ARTIFACTS / "08-api-docs-offline.png"))
    assert _errors(browser) == []

    text = _open(browser, f"{url}/ui/calibration/local-cpu", "09-calibration")
    assert "Factors" in text
    _chart_drawn(browser, "chart-calibration")
    # the site's profile ran on the preset: stored, but presets keep the global calibration
    note = browser.find_element("id", "calibration-note").text
    assert "is a cluster preset" in note and "POST /v1/clusters" in note
    # the finished run on local-cpu (the QLoRA smoke test ran under the lab's own name)
    assert re.search(r"profiles stored\s+1\b", text) and re.search(r"profiles\s+0\b", text), text


def test_run_pages_show_live_progress_and_predicted_vs_measured(site: Site, browser: Any) -> None:
    url = site.url
    text = _open(browser, f"{url}/ui/runs", "10-runs-without-token")
    assert "needs an API token" in text
    browser.execute_script("localStorage.setItem('autopar.token', arguments[0])", site.user_token)

    text = _open(browser, f"{url}/ui/runs", "11-runs")
    assert len(browser.find_elements("css selector", "#app tbody tr")) == 3 and "refreshed every 2 s" in text
    browser.find_element("css selector", "#run-filters select[name=status]").send_keys("succeeded")
    browser.find_element("css selector", "#run-filters button").click()
    _wait(browser, lambda: "status=succeeded" in browser.current_url, "the filtered runs")
    _open(browser, browser.current_url, "11b-runs-succeeded")
    rows = browser.find_elements("css selector", "#app tbody tr")
    assert len(rows) == 2 and {f"#{site.done_run}", f"#{site.cpu_run}"} == {r.text.split()[0] for r in rows}

    text = _open(browser, f"{url}/ui/plans/{site.tiny}", "11c-plan-page-with-runs")
    assert "Runs of this plan" in text and f"#{site.live_run}" in text and "2/10 steps" in text

    text = _open(browser, f"{url}/ui/runs/{site.done_run}", "12-run-finished")
    assert "succeeded" in text and "4/4 steps" in text and "training" not in text
    assert "0.210" in text  # measured step time, rounded
    steps = _chart_drawn(browser, "chart-run-steps")
    assert steps["points"] == [4, 4]
    _chart_drawn(browser, "chart-run-memory")

    text = _open(browser, f"{url}/ui/runs/{site.cpu_run}", "12b-run-cpu-of-a-gpu-plan")
    assert "not compared: CPU run, H100-80GB plan" in text
    _chart_drawn(browser, "chart-run-memory")

    text = _open(browser, f"{url}/ui/runs/{site.live_run}", "13-run-live-before")
    assert "2/10 steps" in text and "training" in text
    site.heartbeat(site.live_run, 7, 10)  # the page polls: the new step appears without a reload
    _wait(browser, lambda: "7/10 steps" in browser.find_element("id", "app").text, "the polled progress")
    browser.save_screenshot(str(ARTIFACTS / "14-run-live-after.png"))
    assert _errors(browser) == []


def test_unknown_ui_path_says_so(site: Site, browser: Any) -> None:
    browser.get(f"{site.url}/ui/nowhere")
    _wait(browser, lambda: browser.execute_script("return document.body.dataset.ready === '1'"), "the page")
    assert "No page at /ui/nowhere" in browser.find_element("id", "app").text
    assert _errors(browser) == []


def test_assets_are_local_shipped_as_package_data_and_licensed() -> None:
    """No page names a remote URL; every file under api/static is matched by the package-data
    globs of pyproject.toml (so a wheel carries it); each vendored library keeps its licence."""
    import fnmatch
    import tomllib

    static = REPO / "api" / "static"
    for name in ("index.html", "app.js"):
        text = (static / name).read_text()
        assert "http://" not in text and "https://" not in text, name
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["api"]
    files = [p.relative_to(REPO / "api").as_posix() for p in static.rglob("*") if p.is_file()]
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert files and unshipped == []
    for licence in ("vendor/chartjs/LICENSE.md", "vendor/swagger-ui/LICENSE", "vendor/swagger-ui/NOTICE"):
        assert (static / licence).stat().st_size > 40
