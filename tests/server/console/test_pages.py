"""Console pages in-process (fake backend, no Ray, no browser): login redirects, what each page shows, live
regions, the form/YAML conversions, escaping and headers, and who sees what."""

from __future__ import annotations

import html
import json
import re
import time
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from tests.server.conftest import make_user, wait_ready

DEMO = {"name": "demo", "worker_groups": [{"name": "cpu", "replicas": 2}], "env": {"NOTE": "<script>alert(1)</script>"}}


def test_pages_send_a_browser_to_login_and_back(client: TestClient) -> None:
    response = client.get("/events?type=Warning", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/login?next=/events%3Ftype%3DWarning"
    login = client.get(response.headers["location"])
    assert 'data-next="/events?type=Warning"' in login.text


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:x"])
def test_login_never_redirects_off_the_server(client: TestClient, target: str) -> None:
    assert 'data-next="/"' in client.get("/login", params={"next": target}).text


def test_a_session_logs_in_and_out(client: TestClient, admin: dict[str, str]) -> None:
    token = admin["Authorization"].split()[1]
    login = client.post("/login", data={"token": token})
    assert login.status_code == 200
    page = client.get("/")
    assert page.status_code == 200
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert csrf and csrf.group(1) == login.json()["csrf_token"]
    assert client.post("/logout").status_code == 403  # no CSRF header
    assert client.post("/logout", headers={"X-CSRF-Token": csrf.group(1)}).status_code == 200
    assert client.get("/", follow_redirects=False).status_code == 303


def test_clusters_page_lists_clusters_and_refreshes_its_region(client: TestClient, admin: dict[str, str]) -> None:
    assert "No clusters yet" in client.get("/", headers=admin).text
    client.post("/api/v1/clusters", json=DEMO, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "demo")
    page = client.get("/", headers=admin)
    row = re.search(r'<tr data-cluster="default/demo">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    cells = [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td.*?>(.*?)</td>", row.group(1), re.S)]
    assert cells[:5] == ["demo", "default", "admin", "Ready", "3 / 3"]
    assert re.fullmatch(r"\d+s", cells[5])
    regions = client.get("/?regions=1", headers=admin)
    assert regions.headers["content-type"] == "application/json"
    assert list(regions.json()) == ["clusters"]
    assert 'data-cluster="default/demo"' in regions.json()["clusters"]


def test_cluster_page_shows_nodes_snippets_manifest_and_escapes_user_text(
    client: TestClient, admin: dict[str, str]
) -> None:
    client.post("/api/v1/clusters", json=DEMO, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "demo")
    page = client.get("/namespaces/default/clusters/demo", headers=admin)
    assert page.status_code == 200
    assert "<script>alert(1)</script>" not in page.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
    for node in ("head", "cpu-0", "cpu-1"):
        assert f'<tr data-node="{node}">' in page.text
    health = re.findall(r'data-testid="node-health"><span class="badge (\w+)">(\w+)</span>', page.text)
    assert health == [("healthy", "Healthy")] * 3
    assert "ray job submit --address raypod://demo --working-dir ." in page.text
    assert 'JobSubmissionClient("raypod://demo")' in html.unescape(page.text)
    assert 'href="/clusters/default/demo/"' in page.text
    manifest = re.search(r'data-testid="manifest"><code>(.*?)</code>', page.text, re.S)
    assert manifest and yaml.safe_load(html.unescape(manifest.group(1)))["kind"] == "RayCluster"
    assert "CreatedHead" in page.text
    regions = client.get("/namespaces/default/clusters/demo?regions=1", headers=admin).json()
    assert set(regions) == {"summary", "nodes", "events", "jobs", "deployments", "spaces"}
    assert "3 / 3" in regions["summary"]


def test_console_pages_carry_a_strict_content_security_policy(client: TestClient, admin: dict[str, str]) -> None:
    for path in ("/login", "/", "/new", "/events"):
        response = client.get(path, headers=admin)
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
        assert "<script>" not in response.text, f"{path} has an inline script"


def test_unknown_pages_render_an_error_page_not_a_traceback(client: TestClient, admin: dict[str, str]) -> None:
    page = client.get("/namespaces/default/clusters/nope", headers=admin)
    assert page.status_code == 404
    assert "text/html" in page.headers["content-type"]
    assert "cluster" in page.text and "nope" in page.text and "Traceback" not in page.text
    assert client.get("/namespaces/default/clusters/nope?regions=1", headers=admin).json()["code"] == "not_found"
    assert client.get("/jobs/rj-0123456789", headers=admin).status_code == 404


def test_form_and_manifest_convert_both_ways(client: TestClient, admin: dict[str, str]) -> None:
    spec = {"name": "x", "head": {"memory": "2Gi"}, "worker_groups": [{"name": "g", "replicas": 2}]}
    manifest = client.post("/ui/manifest", json=spec, headers=admin)
    assert manifest.status_code == 200
    text = manifest.json()["yaml"]
    assert yaml.safe_load(text)["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    resized = re.sub(r"(?i)(replicas): 2", r"\1: 3", text)
    back = client.post("/ui/spec", json={"yaml": resized}, headers=admin)
    assert back.status_code == 200, back.text
    assert back.json()["head"]["memory"] == "2Gi"
    group = back.json()["worker_groups"][0]
    assert (group["replicas"], group["min_replicas"], group["max_replicas"]) == (3, None, None)
    out_of_bounds = client.post("/ui/spec", json={"yaml": text.replace(" replicas: 2", " replicas: 3")}, headers=admin)
    assert out_of_bounds.status_code == 422
    assert "replicas 3 outside [2, 2]" in out_of_bounds.json()["message"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: [RayCluster", "not valid YAML at line 1"),
        ("kind: Pod", "expected apiVersion ray.io/v1 and kind RayCluster"),
        ("- a list", "expected a mapping"),
    ],
)
def test_bad_manifests_get_a_clear_422(client: TestClient, admin: dict[str, str], text: str, message: str) -> None:
    response = client.post("/ui/spec", json={"yaml": text}, headers=admin)
    assert response.status_code == 422
    assert message in response.json()["message"]


def test_invalid_form_spec_names_the_field(client: TestClient, admin: dict[str, str]) -> None:
    response = client.post("/ui/manifest", json={"name": "Bad_Name", "head": {"memory": "lots"}}, headers=admin)
    assert response.status_code == 422
    fields = {problem["field"] for problem in response.json()["detail"]}
    assert fields == {"name", "head.memory"}


def test_events_page_filters_and_shows_only_visible_namespaces(client: TestClient, admin: dict[str, str]) -> None:
    bob = make_user(client, admin, "bob", "research")
    client.post("/api/v1/clusters", json=DEMO, headers=admin).raise_for_status()
    client.post("/api/v1/clusters", json={"name": "mine", "namespace": "research"}, headers=bob).raise_for_status()
    wait_ready(client, admin, "default", "demo")
    wait_ready(client, admin, "research", "mine")

    def shown(headers: dict[str, str], query: str) -> list[str]:
        page = client.get(f"/events?{query}", headers=headers)
        assert page.status_code == 200, page.text
        return re.findall(r'href="/namespaces/([^"]+)"', page.text.split('data-region="event_list"')[1])

    assert {link.split("/clusters/")[0] for link in shown(admin, "")} == {"default", "research"}
    assert set(shown(bob, "")) == {"research/clusters/mine"}
    assert set(shown(admin, "namespace=research")) == {"research/clusters/mine"}
    assert set(shown(admin, "cluster=demo&text=cpu-1")) == {"default/clusters/demo"}
    assert shown(admin, "type=Warning") == []
    assert shown(admin, "namespace=&cluster=&type=&text=") != []  # an empty filter box filters nothing
    assert shown(admin, "cluster=No_Such") == []
    assert client.get("/events?namespace=default", headers=bob).status_code == 403
    # Bob sees only his team's clusters in the list, and only his namespace in the create form.
    assert 'data-cluster="default/demo"' not in client.get("/", headers=bob).text
    namespaces = re.search(r'<select id="f-namespace".*?</select>', client.get("/new", headers=bob).text, re.S)
    assert namespaces and re.findall(r'<option value="([^"]+)"', namespaces.group(0)) == ["research"]


def test_events_api_searches_across_clusters(client: TestClient, admin: dict[str, str]) -> None:
    client.post("/api/v1/clusters", json=DEMO, headers=admin).raise_for_status()
    wait_ready(client, admin, "default", "demo")
    found = client.get("/api/v1/events", params={"text": "100%_"}, headers=admin)
    assert found.status_code == 200 and found.json() == []  # LIKE wildcards are literal
    created = client.get("/api/v1/events", params={"text": "created", "limit": 2}, headers=admin).json()
    assert len(created) == 2 and all("created" in (e["reason"] + e["message"]).lower() for e in created)
    assert client.get("/api/v1/events", params={"type": "Nope"}, headers=admin).status_code == 422


def test_quotas_page_shows_usage_beside_quota_and_the_queue_to_the_teams_members(
    client: TestClient, admin: dict[str, str]
) -> None:
    ana = make_user(client, admin, "ana", "ml")
    bo = make_user(client, admin, "bo", "web")
    client.put("/api/v1/teams/ml/quota", json={"cpus": 1, "memory": "8Gi"}, headers=admin).raise_for_status()
    small = {"head": {"cpus": 1, "memory": "1Gi"}, "namespace": "ml"}
    client.post("/api/v1/clusters", json={"name": "first", **small}, headers=ana).raise_for_status()
    client.post("/api/v1/clusters", json={"name": "second", "priority": "low", **small}, headers=ana)
    wait_ready(client, ana, "ml", "first")

    page = client.get("/quotas", headers=ana).text
    row = re.search(r'<tr data-testid="quota-ml".*?</tr>', page, re.S)
    assert row, page
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td.*?>(.*?)</td>", row.group(0), re.S)]
    assert cells[0] == "1 / 1" and cells[2] == "0 / -" and cells[-1] == "1"  # cpus, gpus, queued
    queue = re.search(r'<table class="list" data-testid="queue">.*?</table>', page, re.S)
    assert queue and "ml/second" in queue.group(0) and "team ml is at its quota: cpus 2/1" in queue.group(0)
    assert 'id="quota-form"' not in page, "a team member who is not its admin was offered the quota form"
    assert client.get("/quotas?regions=1", headers=ana).json().keys() == {"quotas", "queue"}

    client.put("/api/v1/namespaces/ml/quota", json={"clusters": 1}, headers=admin).raise_for_status()
    capped = client.get("/quotas", headers=ana).text
    assert re.search(r'<tr data-testid="quota-ns-ml".*?namespace ml.*?1 / 1', capped, re.S), capped

    others = client.get("/quotas", headers=bo).text
    assert "quota-ml" not in others and "ml/second" not in others and "Nothing waits." in others
    offered = client.get("/quotas", headers=admin).text
    assert 'id="quota-form"' in offered and '<option value="ml">ml</option>' in offered


def test_new_cluster_form_offers_the_priority_classes(client: TestClient, admin: dict[str, str]) -> None:
    form = client.get("/new", headers=admin).text
    assert re.findall(
        r'<option value="(\w+)"[^>]*>\w+</option>', form.split('id="f-priority"')[1].split("</select>")[0]
    ) == [
        "high",
        "normal",
        "low",
    ]


def test_the_cluster_page_shows_the_autoscalers_pending_demand_and_why_it_waits(tmp_path: Path) -> None:
    from raypod import config
    from raypod.backends import base
    from raypod.backends.fake import FakeBackend
    from raypod.server.app import create_app
    from tests.capabilities.autoscaling.test_scaler import resource_state

    backend = FakeBackend(features=FakeBackend().features | {base.Feature.AUTOSCALING, base.Feature.RESOURCE_STATE})
    settings = config.Settings(home=tmp_path, reconcile_interval_s=0.05, tls=False)
    spec = {
        "name": "grow",
        "head": {"cpus": 0},
        "worker_groups": [{"name": "cpu", "replicas": 1, "min_replicas": 1, "max_replicas": 4}],
        "autoscaling": {"idle_timeout_s": 30},
    }
    with TestClient(create_app(settings, backend=backend)) as client:
        token = json.loads((tmp_path / "credentials").read_text())["token"]
        headers = {"Authorization": f"Bearer {token}"}
        uid = client.post("/api/v1/clusters", json=spec, headers=headers).json()["uid"]
        wait_ready(client, headers, "default", "grow")
        backend.resource_states[uid] = resource_state(busy={"cpu-0": False}, tasks=({"CPU": 64}, 1))
        deadline = time.monotonic() + 10
        while not client.get("/api/v1/namespaces/default/clusters/grow", headers=headers).json()["status"][
            "autoscaling"
        ]["pending"]:
            assert time.monotonic() < deadline, "the autoscaler never said what waits"
            time.sleep(0.05)
        client.post("/login", data={"token": token}).raise_for_status()
        page = html.unescape(client.get("/namespaces/default/clusters/grow").text)
    assert "cpu: 1 in [1, 4]; idle nodes go after 30 s" in page
    assert "<li>1 x {64 CPU}: no node shape fits</li>" in page, page[page.index("Autoscaling") :][:800]
