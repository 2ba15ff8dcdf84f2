"""Workspaces end to end: a real JupyterLab on a zero-compute node of a real two-node cluster, reached through
raypod's gateway. A kernel, driven over Jupyter's own REST and websocket API through the gateway, runs
``ray.init(address="auto")`` and fans tasks out: they run on the worker, never on the workspace's node, which
advertises no CPU. Scaling from the notebook adds a node its next cell uses. Strangers are refused at the
gateway; a file written in the notebook survives a stop and a start."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import ssl
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import websockets.sync.client

from raypod import errors, state
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

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
pytest.importorskip("jupyterlab", reason="needs JupyterLab: pip install -e '.[spaces]'")

SPACE = "nb"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaypodServer]:
    with module_server(tmp_path_factory, "raypod-spaces") as started:
        yield started


@pytest.fixture(scope="module")
def cluster(server: RaypodServer) -> state.ClusterView:
    with server.client() as api:
        api.clusters.create(
            {
                "name": "lab",
                "head": {"cpus": 0, "memory": "1Gi"},  # no CPU on the head either: tasks can only go to workers
                "worker_groups": [{"name": "w", "replicas": 1, "min_replicas": 0, "max_replicas": 2, "cpus": 1}],
            }
        )
        return api.clusters.wait_ready("lab", timeout=180)


@pytest.fixture(scope="module")
def space(server: RaypodServer, cluster: state.ClusterView) -> state.SpaceView:
    with server.client() as api:
        created = api.spaces.create(SPACE, "lab")
        assert created.node == "space-nb" and created.url == "/spaces/default/nb/"
        return api.spaces.wait_ready(SPACE, timeout=240)


@pytest.fixture(scope="module")
def http(server: RaypodServer) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url,
        verify=tls_verify(server.ca_file),
        headers={"Authorization": f"Bearer {server.admin_token}"},
        timeout=60,
    ) as client:
        yield client


class Kernel:
    """A Jupyter kernel driven over its websocket through raypod's gateway, as JupyterLab's frontend does."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    def run(self, code: str, timeout: float = 180) -> str:
        """The cell's stdout; fails the test on an error in the cell."""
        msg_id = uuid.uuid4().hex
        self.ws.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": "execute_request",
                        "username": "t",
                        "session": "s",
                        "version": "5.3",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": True,
                        "user_expressions": {},
                        "allow_stdin": False,
                        "stop_on_error": True,
                    },
                    "channel": "shell",
                }
            )
        )
        out = []
        while True:
            message = json.loads(self.ws.recv(timeout=timeout))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                raise AssertionError("cell failed: " + "\n".join(content["traceback"])[-3000:])
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)


@contextlib.contextmanager
def kernel(
    server: RaypodServer, http: httpx.Client, space: str = SPACE, name: str | None = "python3"
) -> Iterator[Kernel]:
    """A new kernel of the workspace (``name`` None: the workspace's default kernel)."""
    created = http.post(f"/spaces/default/{space}/api/kernels", json={"name": name} if name else {})
    assert created.status_code == 201, created.text
    url = f"wss://127.0.0.1:{server.port}/spaces/default/{space}/api/kernels/{created.json()['id']}/channels"
    with websockets.sync.client.connect(
        url,
        ssl=ssl.create_default_context(cafile=server.ca_file),
        additional_headers={"Authorization": f"Bearer {server.admin_token}"},
        max_size=None,
        open_timeout=180,  # JupyterLab answers once the kernel has started; longer than the gateway's 120 s
    ) as ws:
        yield Kernel(ws)


def test_a_notebook_is_a_driver_of_the_cluster_and_its_node_computes_nothing(
    server: RaypodServer, space: state.SpaceView, http: httpx.Client
) -> None:
    with kernel(server, http) as notebook:
        output = notebook.run(
            "import json, ray\n"
            "ray.init(address='auto')\n"
            "me = ray.get_runtime_context().get_node_id()\n"
            "nodes = {n['NodeID']: n for n in ray.nodes() if n['Alive']}\n"
            "@ray.remote\n"
            "def where():\n"
            "    return ray.get_runtime_context().get_node_id()\n"
            "ran = set(ray.get([where.remote() for _ in range(8)]))\n"
            "print(json.dumps({'me_labels': nodes[me]['Labels'], 'me_cpus': nodes[me]['Resources'].get('CPU', 0),\n"
            "  'ran_on': [nodes[n]['Labels'].get('ray.io/node-group') for n in ran]}))\n"
        )
        found = json.loads(output.strip().splitlines()[-1])
        assert found["me_labels"].get("raypod.io/space") == SPACE, "the kernel's driver is on the workspace's node"
        assert found["me_cpus"] == 0
        assert found["ran_on"] == ["w"], "tasks ran on the worker only"

        # Scaling from the notebook: the SDK with the user's token, while the kernel keeps its state.
        grown = notebook.run(
            "import raypod, time\n"
            f"c = raypod.Client(token='{server.admin_token}')  # the server and its CA come with the workspace\n"
            "c.clusters.scale('lab', 'w', 2)\n"
            "deadline = time.time() + 180\n"
            "while sum(1 for n in ray.nodes() if n['Alive'] and n['Labels'].get('ray.io/node-group') == 'w') < 2:\n"
            "    assert time.time() < deadline, 'no second worker'\n"
            "    time.sleep(0.5)\n"
            "@ray.remote(num_cpus=1)\n"
            "def hold():\n"
            "    time.sleep(2)\n"
            "    return ray.get_runtime_context().get_node_id()\n"
            "used = set(ray.get([hold.remote() for _ in range(2)]))\n"
            "print(len(used), me == ray.get_runtime_context().get_node_id())\n"
        )
        assert grown.split()[-2:] == ["2", "True"], grown


def test_strangers_and_missing_credentials_are_refused_at_the_gateway(
    server: RaypodServer, space: state.SpaceView, http: httpx.Client
) -> None:
    assert http.get(f"/spaces/default/{SPACE}/api/status").status_code == 200
    with httpx.Client(base_url=server.url, verify=tls_verify(server.ca_file)) as anonymous:
        assert anonymous.get(f"/spaces/default/{SPACE}/api/status").status_code == 401
        with server.client() as api:
            api.users.create("mallory", team="default")
            token = api.tokens.create("t", user="mallory").token
        stranger = anonymous.get(f"/spaces/default/{SPACE}/api/status", headers={"Authorization": f"Bearer {token}"})
        missing = anonymous.get("/spaces/default/nope/api/status", headers={"Authorization": f"Bearer {token}"})
        assert stranger.status_code == missing.status_code == 404, "a team member who is not its owner sees nothing"
        forged = anonymous.get(f"/spaces/default/{SPACE}/api/status", headers={"Authorization": "token guess"})
        assert forged.status_code == 401, "the IDE's own token scheme is not a way in"
        refused = (websockets.exceptions.InvalidStatus, websockets.exceptions.ConnectionClosed)
        with (
            pytest.raises(refused),
            websockets.sync.client.connect(
                f"wss://127.0.0.1:{server.port}/spaces/default/{SPACE}/api/events/subscribe",
                ssl=ssl.create_default_context(cafile=server.ca_file),
                additional_headers={"Authorization": f"Bearer {token}"},
            ) as ws,
        ):
            ws.recv(timeout=10)


def test_the_ides_token_stays_on_the_server(server: RaypodServer, space: state.SpaceView, http: httpx.Client) -> None:
    token_files = list(server.home.rglob("space-nb.ide.token"))
    assert len(token_files) == 1 and token_files[0].stat().st_mode & 0o777 == 0o600
    token = token_files[0].read_text().strip()
    page = http.get(f"/spaces/default/{SPACE}/lab")
    assert page.status_code == 200 and "JupyterLab" in page.text
    assert token not in page.text, "JupyterLab's page configuration must not carry the IDE's token"
    with kernel(server, http) as notebook:
        seen = notebook.run("import os; print(sorted(k for k in os.environ if 'TOKEN' in k and 'SPACE' in k))")
    assert seen.strip() == "[]", "the kernels (the user's code) do not inherit the IDE's token"
    direct = httpx.get(f"{space_endpoint(server)}/spaces/default/{SPACE}/api/status", timeout=5)
    assert direct.status_code == 403 or direct.status_code == 401, "the IDE's port refuses anyone but the gateway"


def space_endpoint(server: RaypodServer) -> str:
    with server.client() as api:
        return api.clusters.get("lab").status.endpoints[f"space/{SPACE}"]


def test_files_survive_a_stop_and_a_start(server: RaypodServer, space: state.SpaceView, http: httpx.Client) -> None:
    body = {"type": "file", "format": "text", "content": "kept across restarts"}
    assert http.put(f"/spaces/default/{SPACE}/api/contents/notes.txt", json=body).status_code in (200, 201)
    with server.client() as api:
        assert api.spaces.stop(SPACE).state == "Stopped"
        gone = http.get(f"/spaces/default/{SPACE}/api/status")
        assert gone.status_code == 409 and "stopped" in gone.json()["message"]
        api.spaces.start(SPACE)
        api.spaces.wait_ready(SPACE, timeout=240)
    read = http.get(f"/spaces/default/{SPACE}/api/contents/notes.txt")
    assert read.status_code == 200 and read.json()["content"] == "kept across restarts"


def test_a_head_restart_restarts_the_workspace_node_and_a_new_kernels_ray_init_connects(
    server: RaypodServer, space: state.SpaceView, http: httpx.Client
) -> None:
    body = {"type": "file", "format": "text", "content": "kept across a head restart"}
    assert http.put(f"/spaces/default/{SPACE}/api/contents/head.txt", json=body).status_code in (200, 201)
    with server.client() as api:
        started = time.time()
        api.clusters.replace_node("lab", "head")

        def since(reason: str) -> bool:
            return any(
                e.reason == reason and e.node == "space-nb" and e.time.timestamp() >= started
                for e in api.clusters.events("lab", limit=500)
            )

        wait_until(lambda: since("RestartedWithHead"), "the workspace node restarted with the head", 180)
        wait_until(lambda: since("NodeStarted"), "the workspace node started again", 180)
        api.spaces.wait_ready(SPACE, timeout=240)
        # The state is read from the last observation: the restarted IDE itself says when it answers.
        wait_until(lambda: http.get(f"/spaces/default/{SPACE}/api/status").status_code == 200, "the IDE", 120)
    with kernel(server, http) as notebook:
        # The workers restarted with the head too, and may join after the workspace's node: the cell waits for them.
        output = notebook.run(
            "import ray, time\nray.init(address='auto')\n"
            "alive = lambda: len([n for n in ray.nodes() if n['Alive']])\n"
            "deadline = time.time() + 180\n"
            "while alive() < 3 and time.time() < deadline:\n    time.sleep(1)\n"
            "print(alive())\n"
            "print(ray.get(ray.remote(num_cpus=1)(lambda: 'ran').remote()))\n",
            timeout=300,
        )
    alive, ran = output.strip().splitlines()[-2:]  # the cell's stream also carries Ray's log lines
    assert ran == "ran" and int(alive) >= 3, output  # the head, the workers and the workspace's node
    read = http.get(f"/spaces/default/{SPACE}/api/contents/head.txt")
    assert read.status_code == 200 and read.json()["content"] == "kept across a head restart"


def test_bad_requests_get_clear_errors(
    server: RaypodServer, space: state.SpaceView, cluster: state.ClusterView
) -> None:
    with server.client() as api:
        with pytest.raises(errors.AlreadyExists, match="already exists"):
            api.spaces.create(SPACE, "lab")
        with pytest.raises(errors.NotFound):
            api.spaces.create("other", "no-such-cluster")
        with pytest.raises(errors.InvalidSpec, match="kind"):
            api.spaces.create("other", "lab", kind="emacs")
        if shutil.which("code-server") is None:
            with pytest.raises(errors.InvalidSpec, match="npm install -g code-server"):
                api.spaces.create("editor", "lab", kind="code-editor")
        with pytest.raises(errors.InvalidSpec, match="workspace name"):
            api.spaces.create("Bad_Name", "lab")
        assert not {"other", "editor", "Bad_Name"} & {s.name for s in api.spaces.list()}


@pytest.mark.browser
@pytest.mark.skipif(BROWSER_MISSING, reason=f"{CHROMIUM} is not installed (apt-get install chromium)")
def test_the_console_creates_and_opens_a_workspace_and_jupyterlab_loads(
    server: RaypodServer, space: state.SpaceView, page: Any
) -> None:
    expect = pytest.importorskip("playwright.sync_api").expect
    log_in(page, server, "/namespaces/default/clusters/lab")
    page.get_by_label("Workspace name").fill("Bad_Name")
    page.get_by_role("button", name="Create workspace").click()
    expect(page.locator("#space-message")).to_contain_text("workspace name 'Bad_Name'")
    page.get_by_label("Workspace name").fill("second")
    page.get_by_role("button", name="Create workspace").click()
    expect(page.locator("#space-message")).to_contain_text("Starting workspace second")
    second = page.locator('tr[data-space="second"]')
    expect(second.get_by_test_id("space-state")).to_have_text("Ready", timeout=240_000)

    row = page.locator(f'tr[data-space="{SPACE}"]')
    expect(row.get_by_test_id("space-state")).to_have_text("Ready")
    refused: list[str] = []
    page.context.on(
        "response", lambda r: refused.append(f"{r.request.method} {r.url} {r.status}") if r.status >= 400 else None
    )
    page.context.on(
        "console", lambda m: refused.append(f"console {m.type}: {m.text[:300]}") if m.type == "error" else None
    )
    page.context.on("weberror", lambda e: refused.append(f"page error: {e.error}"))
    with page.context.expect_page() as opened:
        row.get_by_test_id("open-space").click()
    lab = opened.value
    lab.wait_for_load_state()
    origin = f"https://{SPACE}--default--ws.localhost:{server.port}"  # the workspace's own origin
    expect(lab).to_have_url(re.compile(rf"^{re.escape(origin)}/spaces/default/{SPACE}/lab"))
    expect(lab).to_have_title(re.compile("JupyterLab"), timeout=60_000)
    BROWSER_ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        expect(lab.locator(".jp-LauncherCard").first).to_be_visible(timeout=60_000)  # the app ran, not its shell
    except AssertionError:
        raise AssertionError(refused) from None
    finally:
        lab.screenshot(path=BROWSER_ARTIFACTS / "space-jupyterlab.png")
    assert not [r for r in refused if "/spaces/" in r], refused

    # Neither cookie is a key for other sites: a change not made by a page of the workspace's own origin is
    # refused before the IDE sees it, and the console's origin serves the IDE to no browser.
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    with httpx.Client(
        base_url=server.url,
        verify=tls_verify(server.ca_file),
        cookies={"__Host-raypod_session": cookies["__Host-raypod_session"]},
    ) as console_session:
        forged = console_session.post(
            f"/spaces/default/{SPACE}/api/kernels", json={"name": "python3"}, headers={"Sec-Fetch-Site": "same-origin"}
        )
        assert forged.status_code == 403, forged.text
    with httpx.Client(
        base_url=server.url,
        verify=tls_verify(server.ca_file),
        cookies={"__Host-raypod_origin": cookies["__Host-raypod_origin"]},
        headers={"Host": urlsplit(origin).netloc},
    ) as origin_session:
        for headers in ({"Sec-Fetch-Site": "cross-site"}, {}, {"Origin": "https://evil.example"}):
            forged = origin_session.post(
                f"/spaces/default/{SPACE}/api/kernels", json={"name": "python3"}, headers=headers
            )
            assert forged.status_code == 403, (headers, forged.text)
    with server.client() as api:
        api.spaces.delete("second")
        assert not {"other", "editor", "Bad_Name"} & {s.name for s in api.spaces.list()}


def test_a_workspace_with_its_own_python_environment_runs_its_kernels_there(
    server: RaypodServer, cluster: state.ClusterView, http: httpx.Client
) -> None:
    """A virtual environment with a package only it has (and, through a .pth file, this installation's Ray and
    ipykernel): the workspace's default kernel runs in it and is a driver of the cluster. It lives in the
    cluster's shared directory, which a sandboxed node can read (raypod's home and the rest of /tmp it cannot)."""
    env = Path(f"/tmp/rp-{cluster.uid[:10]}") / "shared" / "kernel-env"
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    (site / "installation.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (site / "only_in_env.py").write_text("VALUE = 42\n")
    with server.client() as api:
        created = api.spaces.create("envnb", "lab", python_env=str(env))
        assert created.python_env == str(env)
        api.spaces.wait_ready("envnb", timeout=240)
        try:
            with kernel(server, http, "envnb", name=None) as notebook:
                output = notebook.run(
                    "import sys, only_in_env, ray\nray.init(address='auto')\n"
                    "print(sys.prefix)\nprint(only_in_env.VALUE)\n"
                    "print(ray.get(ray.remote(num_cpus=1)(lambda: 'ran').remote()))\n"
                )
            assert output.strip().splitlines()[-3:] == [str(env), "42", "ran"], output
        finally:
            api.spaces.delete("envnb", keep_files=False)
