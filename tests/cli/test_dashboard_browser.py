"""The dashboard of `chandy ui` in a real browser: Debian's Chromium driven by Playwright (never
`playwright install`), a real coordinator with worker participants on the broker, `chandy ui` as a
subprocess. A checkpoint completed after the page loaded appears without a reload, with its duration;
a declined one is marked failed with its reason."""

from __future__ import annotations

import os

import pytest
from playwright import sync_api

from chandy.coordinator.failure import CheckpointException
from tests.fixtures.ui import CHROMIUM, CHROMIUM_ARGS, chandy_ui, get_json, running_job

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"Chromium not found at {CHROMIUM}: `apt-get install chromium` (.ci/run does it)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def test_a_checkpoint_completed_after_load_appears_without_reload(browser, kafka_bootstrap_servers, topic_prefix, tmp_path):
    with running_job(kafka_bootstrap_servers, topic_prefix, tmp_path, decline={3}) as service, \
            chandy_ui(kafka_bootstrap_servers, topic_prefix) as url:
        first = service.trigger_checkpoint().result(30)  # the job exists on the events topic before the page loads
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        # issue 33: no console error from start to stop (a 404 favicon, a 503 health poll, ...)
        page.on("console", lambda message: errors.append(f"console: {message.text}") if message.type == "error" else None)
        page.goto(url, wait_until="load")
        page.evaluate("window.__loadedOnce = true")  # gone if the page reloads
        row = f'#history tr[data-checkpoint-id="{first.checkpoint_id}"][data-status="COMPLETED"]'
        page.wait_for_selector(row, timeout=30_000)
        assert page.text_content(f'#jobs a[data-job-id="{service.job_id}"]') == service.job_id
        # issue 33: the job's name beside its ID
        assert page.text_content(f'#jobs span[data-job-name="{service.job_id}"]') == f"job of {topic_prefix}"
        assert page.locator("#history tbody tr").count() == 1
        assert page.text_content("#job-status") == "RUNNING"

        second = service.trigger_checkpoint().result(30)  # completes while the page is open
        row = f'#history tr[data-checkpoint-id="{second.checkpoint_id}"][data-status="COMPLETED"]'
        page.wait_for_selector(row, timeout=30_000)
        status, details = get_json(f"{url}jobs/{service.job_id}/checkpoints/details/{second.checkpoint_id}")
        assert status == 200
        assert page.text_content(f"{row} td.duration") == f"{details['end_to_end_duration']} ms"
        assert page.text_content(f"{row} td.size") == "14 B"
        assert page.text_content('#counts [data-count="completed"] b') == "2"
        assert page.locator(f'#chart circle.point[data-checkpoint-id="{second.checkpoint_id}"]').count() == 1
        # issue 33: labelled axes with units and wall-clock dates; p95 and p99.9 of the duration
        assert page.text_content("#chart text.axis-title.duration") == "end-to-end duration (ms)"
        assert page.text_content("#chart text.axis-title.size") == "state size (bytes)"
        labels = [t.text_content() for t in page.locator("#chart text.x-label").all()]
        year = str(__import__("datetime").date.today().year)
        assert len(labels) == 2 and labels[0].startswith(f"#{first.checkpoint_id} · ") and year in labels[0], labels
        headers = [h.text_content() for h in page.locator("#summary thead th").all()]
        assert {"p95", "p99.9"} <= set(headers), headers
        assert page.locator('#summary tr[data-summary="end_to_end_duration"] td').count() == 8
        assert page.evaluate("window.__loadedOnce") is True

        with pytest.raises(CheckpointException, match="declined|simulated"):
            service.trigger_checkpoint().result(30)  # checkpoint 3 is declined by a worker
        failed = page.wait_for_selector('#history tr[data-checkpoint-id="3"][data-status="FAILED"]', timeout=30_000)
        assert "CHECKPOINT_DECLINED" in (failed.text_content() or "")
        marker = page.locator('#chart circle.point.failed[data-checkpoint-id="3"] title')
        assert "CHECKPOINT_DECLINED" in (marker.text_content() or "")
        assert "CHECKPOINT_DECLINED" in (page.text_content("#latest-failed") or "")
        assert page.evaluate("window.__loadedOnce") is True
        assert errors == []
        if os.environ.get("CHANDY_UI_SCREENSHOT"):
            page.screenshot(path=os.environ["CHANDY_UI_SCREENSHOT"], full_page=True)
        page.close()
