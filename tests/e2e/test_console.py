"""The console's whole journey in a real browser (Debian's chromium, driven by Playwright) against a real
raypod server and real Ray nodes: log in, create a cluster from the form and its YAML tab, watch it become
ready, open its Ray dashboard through the gateway, submit a job with an uploaded folder and watch its log
stream, scale, filter events, delete. Each step leaves a screenshot in test-artifacts/console/."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from raypod import errors
from tests.e2e.conftest import BROWSER_ARTIFACTS, BROWSER_MISSING, CHROMIUM, RaypodServer

CLUSTER = "console-demo"
ARTIFACTS = BROWSER_ARTIFACTS / "console"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.timeout(900),
    pytest.mark.skipif(BROWSER_MISSING, reason=f"{CHROMIUM} is not installed (apt-get install chromium)"),
]

playwright_sync = pytest.importorskip("playwright.sync_api")
expect = playwright_sync.expect


class Shots:
    def __init__(self, page: playwright_sync.Page) -> None:
        self.page = page
        self.count = 0
        shutil.rmtree(ARTIFACTS, ignore_errors=True)
        ARTIFACTS.mkdir(parents=True)

    def __call__(self, name: str, target: playwright_sync.Page | None = None) -> None:
        self.count += 1
        (target or self.page).screenshot(path=ARTIFACTS / f"{self.count:02d}-{name}.png", full_page=True)


def test_console_journey(page: playwright_sync.Page, raypod_server: RaypodServer, tmp_path: Path) -> None:
    shot = Shots(page)
    base = raypod_server.url

    # Login: a page asked for without a session leads to the login form, a wrong token shows its error.
    page.goto(f"{base}/events")
    expect(page).to_have_url(re.compile(r"/login\?next=/events$"))
    expect(page.get_by_label("API token")).to_be_visible()
    shot("login")
    page.get_by_label("API token").fill("rpt_000000000000_not-a-real-token")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#login-error")).to_contain_text("Login failed")
    expect(page.get_by_label("API token")).to_have_attribute("aria-invalid", "true")
    shot("login-error")
    page.get_by_label("API token").fill(raypod_server.admin_token)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{base}/events")
    expect(page.get_by_test_id("user")).to_have_text("admin")
    page.get_by_role("link", name="Clusters", exact=True).click()
    expect(page.get_by_role("heading", name="Clusters")).to_be_visible()

    # Create form: every field is labelled; an invalid form shows its errors inline and creates nothing.
    with raypod_server.client() as api:
        before = {(v.spec.namespace, v.spec.name) for v in api.clusters.list()}
    page.get_by_role("link", name="New cluster").first.click()
    unlabelled = page.evaluate(
        "[...document.querySelectorAll('input, select, textarea')]"
        ".filter(e => e.type !== 'hidden' && e.labels.length === 0).map(e => e.outerHTML)"
    )
    assert unlabelled == []
    page.get_by_label("Name", exact=True).fill("Bad_Name")
    page.get_by_label("Memory", exact=True).fill("lots")
    page.get_by_role("button", name="Create cluster").click()
    expect(page.locator("#form-error")).to_contain_text("cluster name 'Bad_Name'")
    expect(page.get_by_label("Name", exact=True)).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Memory", exact=True)).to_have_attribute("aria-invalid", "true")
    shot("create-invalid")
    with raypod_server.client() as api:
        assert {(v.spec.namespace, v.spec.name) for v in api.clusters.list()} == before

    page.get_by_label("Name", exact=True).fill(CLUSTER)
    page.get_by_label("Memory", exact=True).fill("512Mi")
    page.get_by_label("Object store", exact=True).fill("100Mi")
    page.get_by_label("Memory per worker").fill("512Mi")
    page.get_by_label("Object store per worker").fill("100Mi")
    page.get_by_label("Environment variables").fill("GREETING=hello from the console")
    page.get_by_label("Hang timeout").fill("15m")
    page.get_by_label("On a hang").select_option("cancel")

    # YAML tab: the RayCluster the form describes; an edit comes back to the form, broken YAML is refused.
    page.get_by_role("tab", name=re.compile("YAML")).click()
    manifest = page.get_by_label("RayCluster manifest")
    expect(manifest).to_have_value(re.compile(r"kind: RayCluster[\s\S]*name: console-demo[\s\S]*GREETING"))
    edited = manifest.input_value().replace("memory: '536870912'", "memory: 600Mi", 1)
    assert edited != manifest.input_value()
    manifest.fill("kind: [RayCluster")
    page.get_by_role("tab", name="Form").click()
    expect(page.locator("#form-error")).to_contain_text("not valid YAML")
    expect(page.get_by_role("tab", name=re.compile("YAML"))).to_have_attribute("aria-selected", "true")
    shot("yaml-invalid")
    manifest.fill(edited)
    shot("yaml")
    page.get_by_role("tab", name="Form").click()
    expect(page.get_by_label("Memory", exact=True)).to_have_value("600Mi")
    expect(page.get_by_label("Environment variables")).to_have_value("GREETING=hello from the console")
    expect(page.get_by_label("Hang timeout")).to_have_value("900s")
    expect(page.get_by_label("On a hang")).to_have_value("cancel")
    page.get_by_role("button", name="Create cluster").click()

    # Cluster page: becomes Ready without a reload, nodes show their resources.
    expect(page).to_have_url(f"{base}/namespaces/default/clusters/{CLUSTER}")
    with raypod_server.client() as api:
        hangwatch = api.clusters.get(CLUSTER).spec.hangwatch
    assert (hangwatch.enabled, hangwatch.timeout, hangwatch.action.value) == (True, 900, "cancel")
    shot("cluster-provisioning")
    summary = page.locator("[data-region=summary]")
    expect(summary.get_by_test_id("phase")).to_have_text("Ready", timeout=180_000)
    expect(summary.get_by_test_id("nodes")).to_have_text("2 / 2")
    nodes = page.get_by_test_id("nodes-table")
    expect(nodes.locator("tr[data-node=head]")).to_contain_text("600Mi")
    expect(nodes.locator("tr[data-node=workers-0]")).to_contain_text("Running")
    expect(nodes.locator("tr[data-node=workers-0]").get_by_test_id("node-health")).to_have_text("Healthy")
    expect(page.get_by_test_id("events")).to_contain_text("CreatedHead")
    expect(page.get_by_text(f"--address raypod://{CLUSTER}")).to_be_visible()
    shot("cluster-ready")

    # The Ray dashboard, through the gateway, in a new tab, on the browser session alone: on the cluster's own
    # origin (never the console's), entered with a one-time ticket.
    with page.context.expect_page() as opened:
        page.get_by_test_id("open-dashboard").click()
    dashboard = opened.value
    dashboard.wait_for_load_state()
    origin = f"https://{CLUSTER}--default.localhost:{raypod_server.port}"
    expect(dashboard).to_have_url(re.compile(rf"^{re.escape(origin)}/"))
    expect(dashboard).to_have_title(re.compile("Ray"))
    expect(dashboard.get_by_role("link", name="Overview")).to_be_visible()
    # Asked by the page itself (Playwright's own HTTP client does not resolve *.localhost as browsers do).
    version = dashboard.evaluate("fetch('/api/version').then(r => r.json())")
    assert "ray_version" in version
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["__Host-raypod_origin"]["domain"] == f"{CLUSTER}--default.localhost", (
        "the origin's cookie is its own"
    )
    assert cookies["__Host-raypod_session"]["domain"] == "127.0.0.1", "the console's cookie stays on the console"
    shot("ray-dashboard", dashboard)
    dashboard.close()

    # Submit a job with a folder uploaded as its working dir; the log view shows lines as they are printed.
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "ticks.py").write_text(
        "import os, time\n"
        "print(os.environ['GREETING'], flush=True)\n"
        "for i in range(1, 11):\n"
        "    print(f'tick {i}', flush=True)\n"
        "    time.sleep(0.8)\n"
        "print('all done', flush=True)\n"
    )
    page.get_by_role("link", name="Submit job").click()
    page.get_by_label("Entrypoint").fill("python ticks.py")
    page.get_by_label(re.compile("Working directory")).set_input_files(folder)
    page.get_by_label("Retries after a failure").fill("1")
    shot("job-form")
    page.get_by_role("button", name="Submit job").click()
    expect(page).to_have_url(re.compile(r"/jobs/rj-[0-9a-f]{10}$"))
    log = page.get_by_test_id("log")
    expect(log).to_contain_text("tick 1", timeout=120_000)
    early = log.inner_text()
    assert "all done" not in early, "the log arrived only at the end: it should stream"
    shot("job-streaming")
    expect(log).to_contain_text("all done", timeout=60_000)
    expect(log).to_contain_text("hello from the console")
    expect(page.get_by_test_id("job-status")).to_have_text("SUCCEEDED", timeout=30_000)
    expect(page.get_by_role("button", name="Stop job")).to_be_disabled()
    shot("job-succeeded")

    # A long job, stopped from its page: never retried.
    page.get_by_role("link", name=f"default/{CLUSTER}").click()
    page.get_by_role("link", name="Submit job").click()
    page.get_by_label("Entrypoint").fill("python -c \"import time; print('sleeping', flush=True); time.sleep(600)\"")
    page.get_by_label("Retries after a failure").fill("2")
    page.get_by_role("button", name="Submit job").click()
    expect(page.get_by_test_id("log")).to_contain_text("sleeping", timeout=60_000)
    page.get_by_role("button", name="Stop job").click()
    expect(page.locator("#job-message")).to_have_text("Stop requested.")
    expect(page.get_by_test_id("job-status")).to_have_text("STOPPED", timeout=60_000)
    expect(page.get_by_role("button", name="Stop job")).to_be_disabled()
    shot("job-stopped")

    # Scale the worker group from the cluster page; the new node shows up live.
    page.get_by_role("link", name=f"default/{CLUSTER}").click()
    expect(page.get_by_test_id("jobs-table")).to_contain_text("SUCCEEDED")
    expect(page.get_by_test_id("jobs-table")).to_contain_text("STOPPED")
    page.get_by_label("Workers in group workers").fill("2")
    page.get_by_role("button", name="Scale").click()
    expect(page.locator("#scale-message")).to_contain_text("Scaling group workers to 2")
    expect(summary.get_by_test_id("nodes")).to_have_text("3 / 3", timeout=120_000)
    expect(nodes.locator("tr[data-node=workers-1]")).to_contain_text("Running")
    shot("cluster-scaled")

    # Events across clusters, filtered.
    page.get_by_role("link", name="Events").click()
    page.get_by_label("Cluster").fill(CLUSTER)
    page.get_by_label("Contains").fill("Scaled")
    page.get_by_role("button", name="Filter").click()
    events = page.get_by_test_id("events")
    expect(events).to_contain_text("workers: 1 -> 2 replicas")
    expect(events.locator("li")).to_have_count(1)
    shot("events")

    # Delete, confirmed by typing the name; the page notices when the cluster is gone.
    page.get_by_role("link", name=f"default/{CLUSTER}").first.click()
    page.get_by_role("button", name="Delete…").click()
    confirm = page.get_by_role("button", name="Delete cluster")
    expect(confirm).to_be_disabled()
    page.get_by_label("Type").fill(CLUSTER)
    shot("delete-confirm")
    confirm.click()
    expect(page.locator("#cluster-gone")).to_be_visible(timeout=120_000)
    shot("cluster-deleted")
    with raypod_server.client() as api, pytest.raises(errors.NotFound):
        api.clusters.get(CLUSTER)
    page.get_by_role("link", name="Back to clusters").click()
    expect(page.locator(f"tr[data-cluster='default/{CLUSTER}']")).to_have_count(0)
    shot("clusters-empty")


def test_keyboard_reaches_the_login_form_with_visible_focus(
    page: playwright_sync.Page, raypod_server: RaypodServer
) -> None:
    page.goto(f"{raypod_server.url}/login")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    if raypod_server.oidc is not None:  # the session server signs users in with a provider too: its button first
        assert page.evaluate("document.activeElement.dataset.testid") == "sso-login"
        assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") not in ("", "none")
        page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.id") == "token"
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none")
