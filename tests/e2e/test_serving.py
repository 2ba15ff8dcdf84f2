"""Serving end to end on a real two-node cluster: a model built here (random weights, no download) goes into the
catalog through a real S3 server, is deployed on Ray Serve with two replicas, and answers the official OpenAI
client through raypod's gateway: completions, chat, streaming; a prefix one replica computed is served from L2 by
the other; a replica killed mid-stream gives the client a clean error and the next request is served; bad deploys
are refused before anything starts; an unchanged Ray Serve script is reachable through the gateway too."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from raypod import errors, state, testing
from raypod.client._http import tls_verify
from tests.e2e.conftest import (
    BROWSER_ARTIFACTS,
    BROWSER_MISSING,
    CHROMIUM,
    RaypodServer,
    log_in,
    module_server,
    wait_until,
)
from tests.e2e.test_gateway import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SCRIPTS = Path(__file__).parent / "scripts"
READER = {"AWS_ACCESS_KEY_ID": "reader-access", "AWS_SECRET_ACCESS_KEY": "reader-secret-0123456789"}
# The S3 server of these tests is on loopback, which the server contacts only where its operator allows it.
SERVER_ENV = {**READER, "RAYPOD_OUTBOUND_ALLOW": "127.0.0.1,localhost"}
MODEL = "llama-tiny"


@pytest.fixture(scope="module")
def local_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model in a directory of this host's temporary root (which sandboxed nodes do not see)."""
    pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[serving]'")
    from raypod.serving.testing import build_llama

    return build_llama(tmp_path_factory.mktemp("model") / MODEL, "tiny", max_context=1024)


@pytest.fixture(scope="module")
def model_url(s3: testing.S3Server, local_model: Path) -> str:
    """The tiny model, uploaded with the writer's keys; the server and the nodes read it as the reader."""
    import fsspec

    fs = fsspec.filesystem("s3", **s3.options("writer"))
    for path in local_model.iterdir():
        fs.put_file(str(path), f"{s3.bucket}/{MODEL}/{path.name}")
    return s3.url(MODEL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaypodServer]:
    with module_server(tmp_path_factory, "raypod-serving", extra_env=SERVER_ENV) as started:
        yield started


@pytest.fixture(scope="module")
def cluster(server: RaypodServer, model_url: str) -> state.ClusterView:
    with server.client() as api:
        api.clusters.create(
            {
                "name": "serving",
                "head": {"cpus": 2, "memory": "1Gi"},  # one CPU for a replica, one for a user's own app
                "worker_groups": [{"name": "w", "replicas": 1, "cpus": 1, "memory": "1Gi"}],
                "env": READER,
            }
        )
        return api.clusters.wait_ready("serving", timeout=180)


@pytest.fixture(scope="module")
def catalogued(server: RaypodServer, s3: testing.S3Server, model_url: str) -> str:
    options = json.dumps({"client_kwargs": {"endpoint_url": s3.endpoint, "region_name": "us-east-1"}})
    added = run_cli(server, "raypod", "model", "add", MODEL, model_url, "--storage-options", options)
    assert added.returncode == 0, added.stdout + added.stderr
    listed = json.loads(run_cli(server, "raypod", "model", "list", "-o", "json").stdout)
    assert [(m["id"], m["architecture"]) for m in listed] == [(MODEL, "LlamaForCausalLM")]
    return MODEL


@pytest.fixture
def deployed(server: RaypodServer, cluster: state.ClusterView, catalogued: str) -> state.DeploymentView:
    """The module's deployment, made by the first test that needs it (and again after the test that deletes it,
    so the tests pass in any order)."""
    with server.client() as api:
        if "tiny" in {d.name for d in api.serving.list("serving")}:
            return api.serving.get("serving", "tiny")
    result = run_cli(
        server, "raypod", "serve", "deploy", catalogued, "--cluster", "serving", "--replicas", "2", "--name", "tiny"
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "RUNNING" in result.stderr and "/clusters/default/serving/serve/tiny/v1" in result.stdout
    with server.client() as api:
        deployment = api.serving.get("serving", "tiny")
    assert [r.state for r in deployment.replicas] == ["RUNNING", "RUNNING"]
    assert len({r.node_id for r in deployment.replicas}) == 2, "one replica per node (1 CPU each)"
    return deployment


@pytest.fixture
def openai_client(server: RaypodServer, deployed: state.DeploymentView) -> Iterator[Any]:
    openai = pytest.importorskip("openai", reason="needs the openai client: pip install -e '.[test]'")
    http = httpx.Client(verify=tls_verify(server.ca_file), timeout=120)
    with server.client() as api:
        base_url = api.serving.openai_base_url("serving", deployed.name)
    client = openai.OpenAI(base_url=base_url, api_key=server.admin_token, http_client=http, max_retries=0)
    yield client
    http.close()


def host_pid(title: str, pid: int) -> int:
    """The host's pid of a replica that reported ``pid`` from inside its node's PID namespace (if it has one)."""
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        if title not in " ".join(process.info["cmdline"] or []):
            continue
        try:
            status = Path(f"/proc/{process.pid}/status").read_text()
        except OSError:
            continue
        namespaced = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")]
        if namespaced and int(namespaced[0][-1]) == pid:
            return process.pid
    raise AssertionError(f"no {title} process with pid {pid} in its namespace")


def test_the_official_openai_client_gets_models_completions_chat_and_streams(openai_client: Any) -> None:
    assert [m.id for m in openai_client.models.list().data] == [MODEL]
    completion = openai_client.completions.create(
        model=MODEL, prompt="the quick brown fox", max_tokens=8, temperature=0
    )
    assert completion.choices[0].text and completion.usage.completion_tokens >= 1
    again = openai_client.completions.create(model=MODEL, prompt="the quick brown fox", max_tokens=8, temperature=0)
    assert again.choices[0].text == completion.choices[0].text, "greedy answers repeat"
    chat = openai_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    stream = openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content, "streamed and whole answers agree"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens


def test_client_mistakes_get_openai_errors_never_a_5xx(openai_client: Any, server: RaypodServer) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as too_long:
        openai_client.completions.create(model=MODEL, prompt="fox " * 2000, max_tokens=8)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        openai_client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        openai_client.completions.create(model=MODEL, prompt="hi", max_tokens=-3)
    url = f"{server.url}/clusters/default/serving/serve/tiny/v1/completions"
    with httpx.Client(verify=tls_verify(server.ca_file)) as http:
        broken = http.post(url, content=b"{not json", headers={"Authorization": f"Bearer {server.admin_token}"})
        assert broken.status_code == 400 and "error" in broken.json()
        anonymous = http.post(url, json={"model": MODEL, "prompt": "hi"})
        assert anonymous.status_code == 401, "the model's endpoint is as authenticated as the dashboard"


def test_a_prefix_one_replica_computed_is_served_from_l2_by_the_other(openai_client: Any) -> None:
    attempts = itertools.count()
    seen: list[dict[str, Any]] = []

    def ask(prompt: str) -> tuple[str, dict[str, Any]]:
        response = openai_client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
        seen.append(response.raypod)
        return response.choices[0].text, response.raypod

    def l2_hit_elsewhere() -> tuple[list[str], dict[str, Any], list[dict[str, Any]]] | None:
        """A fresh document; the replica that first answers computes it; ask again until the other node answers
        (Serve picks replicas). None when that node raced ahead of the write and computed it itself."""
        attempt = next(attempts)
        prompt = " ".join(f"line {i} of document {attempt} about foxes and dogs." for i in range(25)) + " what jumps?"
        text, first = ask(prompt)
        texts, same_node = [text], []
        for _ in range(16):
            text, trace = ask(prompt)
            texts.append(text)
            if trace["node"] != first["node"]:
                return (texts, trace, same_node) if trace["cache_chunks"].get("l2") else None
            same_node.append(trace)
        return None

    try:
        texts, other, same_node = wait_until(l2_hit_elsewhere, "a prefix served from L2 by the other node", 120)
    except Exception as exc:
        raise AssertionError(f"{exc}; the last answers came from: {seen[-6:]}") from None
    assert other["cached_tokens"] >= 256, other
    assert len(set(texts)) == 1, "the same greedy answer from every replica and tier"
    # The first node's own L1 serves it again, once the first answer's writes are done (an answer that started while
    # they were still queued may compute it: a race, not a miss).
    settled = [trace for trace in same_node if not trace.get("queued_writes")]
    assert all(trace["cache_chunks"].get("l1", 0) >= 1 for trace in settled), f"the first node's L1: {same_node}"


def test_a_replica_killed_mid_stream_fails_the_stream_cleanly_and_the_next_request_is_served(
    openai_client: Any, server: RaypodServer
) -> None:
    import openai

    stream = openai_client.completions.create(
        model=MODEL, prompt="a long story:", max_tokens=900, temperature=0, stream=True
    )
    first = next(iter(stream))
    victim = first.raypod["pid"]
    os.kill(host_pid("ServeReplica:tiny", victim), signal.SIGKILL)
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in stream:
            pass
    after = openai_client.completions.create(model=MODEL, prompt="still there?", max_tokens=4, temperature=0)
    assert after.choices[0].text and after.raypod["pid"] != victim
    with server.client() as api:
        wait_until(
            lambda: sum(r.state == "RUNNING" for r in api.serving.get("serving", "tiny").replicas) == 2,
            "Serve to replace the killed replica",
            timeout=180,
        )


def test_kv_cache_and_ttft_metrics_reach_the_nodes_metrics_endpoints(server: RaypodServer, openai_client: Any) -> None:
    openai_client.completions.create(model=MODEL, prompt="metrics " * 100, max_tokens=2, temperature=0)
    with server.client() as api:
        targets = [t for group in api.monitoring.targets() for t in group["targets"]]

    def exported() -> bool:
        text = ""
        for target in targets:
            try:
                text += httpx.get(f"http://{target}/metrics", timeout=5).text
            except httpx.HTTPError:
                continue
        return "ray_raypod_serve_ttft_seconds" in text and "ray_raypod_kv_cache_" in text

    wait_until(exported, "raypod's serving metrics on a node's metrics endpoint", timeout=90)


def test_bad_deploys_are_refused_or_fail_saying_why_before_anything_starts(
    server: RaypodServer,
    cluster: state.ClusterView,
    s3: testing.S3Server,
    model_url: str,
    catalogued: str,
    local_model: Path,
) -> None:
    import fsspec

    with server.client() as api:
        with pytest.raises(errors.NotFound, match="not in the catalog"):
            api.serving.deploy("serving", "no-such-model")
        with pytest.raises(errors.InvalidSpec, match="CPUs"):
            api.serving.deploy("serving", {"model": catalogued, "cpus": 4})
        with pytest.raises(errors.InvalidSpec, match="object store"):
            api.serving.deploy("serving", {"model": catalogued, "l1_bytes": "64Gi"})
        fs = fsspec.filesystem("s3", **s3.options("writer"))
        for path in fs.ls(f"{s3.bucket}/{MODEL}"):
            fs.copy(path, f"{s3.bucket}/corrupt/{path.rsplit('/', 1)[1]}")
        api.models.add("llama-corrupt", s3.url("corrupt"), storage_options=api.models.get(catalogued).storage_options)
        weights = f"{s3.bucket}/corrupt/model.safetensors"
        data = bytearray(fs.cat_file(weights))
        data[len(data) // 2] ^= 0xFF
        fs.pipe_file(weights, bytes(data))
        # The files are checked by the deployment applier, not the request: the deployment says why it failed.
        api.serving.deploy("serving", {"model": "llama-corrupt", "name": "corrupt"})
        with pytest.raises(errors.InvalidSpec, match=r"model\.safetensors is corrupt"):
            api.serving.wait_running("serving", "corrupt", timeout=60)
        assert api.serving.get("serving", "corrupt").status == "DEPLOY_FAILED"
        api.serving.delete("serving", "corrupt")
        wait_until(lambda: "corrupt" not in {d.name for d in api.serving.list("serving")}, "the failed one deleted", 30)
        if api.info().isolated:  # sandboxed nodes have a temporary root of their own
            api.models.add("llama-hidden", str(local_model))
            with pytest.raises(errors.InvalidSpec, match=r"nodes of cluster serving cannot read .*own"):
                api.serving.deploy("serving", {"model": "llama-hidden", "name": "hidden"})
            assert "hidden" not in {d.name for d in api.serving.list("serving")}


def test_an_unchanged_serve_script_is_reachable_through_the_gateway(
    server: RaypodServer, deployed: state.DeploymentView, tmp_path: Path
) -> None:
    shutil.copy(SCRIPTS / "serve_http_script.py", tmp_path / "serve_http_script.py")
    result = run_cli(
        server,
        "ray",
        "job",
        "submit",
        "--address",
        "raypod://serving",
        "--working-dir",
        str(tmp_path),
        "--",
        "python",
        "serve_http_script.py",
    )
    assert result.returncode == 0 and "greeter-deployed" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    with httpx.Client(verify=tls_verify(server.ca_file)) as http:
        answer = http.get(
            f"{server.url}/clusters/default/serving/serve/greeter?name=raypod",
            headers={"Authorization": f"Bearer {server.admin_token}"},
        )
    assert answer.status_code == 200 and answer.json() == {"greeting": "hello raypod"}
    with server.client() as api:
        assert api.serving.get("serving", "tiny").status == "RUNNING", "the user's app runs beside the model"


@pytest.mark.browser
@pytest.mark.skipif(BROWSER_MISSING, reason=f"{CHROMIUM} is not installed (apt-get install chromium)")
def test_an_admin_who_opens_a_hostile_serve_page_gives_it_nothing_of_the_console(
    server: RaypodServer, deployed: state.DeploymentView, page: Any, tmp_path: Path
) -> None:
    """Issue 28: a cluster operator's Serve page, opened by an admin from the console, runs on the cluster's own
    origin: it can neither read the console nor act with the admin's console session, nor replace its cookie."""
    shutil.copy(SCRIPTS / "serve_hostile_script.py", tmp_path / "serve_hostile_script.py")
    result = run_cli(
        server, "ray", "job", "submit", "--address", "raypod://serving", "--working-dir", str(tmp_path),
        "--", "python", "serve_hostile_script.py",
    )  # fmt: skip
    assert result.returncode == 0 and "hostile-deployed" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    log_in(page, server, "/")
    session = next(c for c in page.context.cookies() if c["name"].endswith("raypod_session"))
    page.goto(f"{server.url}/clusters/default/serving/serve/hostile?console={server.url}")
    origin = f"https://serving--default.localhost:{server.port}"
    expect = pytest.importorskip("playwright.sync_api").expect
    expect(page).to_have_url(re.compile(rf"^{re.escape(origin)}/serve/hostile"))
    expect(page).to_have_title(re.compile("^done "), timeout=30_000)
    BROWSER_ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=BROWSER_ARTIFACTS / "hostile-serve-page.png")
    title = page.title()
    assert "admin-at-console:blocked" in title, title  # another site: no cookie sent, and CORS hides the page
    assert "here-csrf:none" in title and "admin-here:201" not in title, title  # its own origin is not the console
    with server.client() as api:
        assert "mallory" not in [user.name for user in api.users.list()], "the page made an admin"
    after = next(c for c in page.context.cookies() if c["name"] == session["name"] and c["domain"] == "127.0.0.1")
    assert after["value"] == session["value"], "the console's session cookie was replaced"
    page.goto(f"{server.url}/")
    expect(page).to_have_url(f"{server.url}/")  # still logged in: the session was neither ended nor replaced


@pytest.mark.browser
@pytest.mark.skipif(BROWSER_MISSING, reason=f"{CHROMIUM} is not installed (apt-get install chromium)")
def test_the_console_lists_deploys_and_deletes_models(
    server: RaypodServer, deployed: state.DeploymentView, page: Any
) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    cluster_page = "/namespaces/default/clusters/serving"
    log_in(page, server, cluster_page)
    row = page.locator('tr[data-deployment="tiny"]')
    expect(row.get_by_test_id("deployment-status")).to_have_text("RUNNING")
    expect(row).to_contain_text("/clusters/default/serving/serve/tiny/v1")
    expect(row).to_contain_text("2 / 2")

    form = page.locator("#deploy-form")
    form.get_by_label("Model").select_option(MODEL)
    form.get_by_label("Name (optional)").fill("console")
    form.get_by_label("CPUs per replica").fill("4")
    form.get_by_role("button", name="Deploy model").click()
    expect(page.locator("#form-error")).to_contain_text("CPUs")
    with server.client() as api:
        assert "console" not in {d.name for d in api.serving.list("serving")}

    form.get_by_label("CPUs per replica").fill("0")  # no CPU of its own: the cluster's are taken
    form.get_by_label("Tiered KV cache").uncheck()
    form.get_by_role("button", name="Deploy model").click()
    expect(page.locator("#deployment-message")).to_contain_text("as console")
    console_row = page.locator('tr[data-deployment="console"]')
    expect(console_row.get_by_test_id("deployment-status")).to_have_text("RUNNING", timeout=240_000)
    expect(console_row).not_to_contain_text("KV cache")
    BROWSER_ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=BROWSER_ARTIFACTS / "serving-console.png", full_page=True)

    console_row.get_by_role("button", name="Delete").click()
    expect(page.locator("#deployment-message")).to_have_text("Deleting console.")
    expect(console_row).to_have_count(0)
    with server.client() as api:
        assert {d.name for d in api.serving.list("serving")} == {"tiny"}


def test_list_status_and_delete(server: RaypodServer, deployed: state.DeploymentView) -> None:
    listed = json.loads(run_cli(server, "raypod", "serve", "list", "--cluster", "serving", "-o", "json").stdout)
    assert [(d["name"], d["model"], d["status"]) for d in listed] == [("tiny", MODEL, "RUNNING")]
    status = run_cli(server, "raypod", "serve", "status", "tiny", "--cluster", "serving", "-o", "json")
    assert '"status": "RUNNING"' in status.stdout
    deleted = run_cli(server, "raypod", "serve", "delete", "tiny", "--cluster", "serving")
    assert deleted.returncode == 0, deleted.stderr
    with server.client() as api:
        wait_until(lambda: api.serving.list("serving") == [], "the deployment forgotten", 30)

        def gone() -> bool:
            with httpx.Client(verify=tls_verify(server.ca_file)) as http:
                response = http.get(
                    f"{server.url}/clusters/default/serving/serve/tiny/v1/models",
                    headers={"Authorization": f"Bearer {server.admin_token}"},
                )
            return response.status_code == 404

        wait_until(gone, "the application to leave Serve", timeout=60)
