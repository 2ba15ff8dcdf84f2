"""Whether a workspace is in use, asked of a real JupyterLab started as a node starts it (``ide.command``, the
gateway's identity provider, the IDE's token): no kernel is idle since never, a busy kernel is in use, an idle one
says when it last ran, a code editor and an IDE that does not answer are in use (what is not known to be idle is
not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client

from raypod import spec as spec_mod
from raypod.capabilities.spaces import activity, ide
from raypod.capabilities.spaces.jupyter_identity import TOKEN_VARIABLE
from raypod.testing import free_port

pytest.importorskip("jupyterlab", reason="needs JupyterLab: pip install -e '.[spaces]'")
BASE = "/spaces/ml/nb/"
TOKEN = "ide-token-for-the-test"
JUPYTERLAB = spec_mod.SpaceKind.JUPYTERLAB


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root, port = tmp_path_factory.mktemp("files"), free_port()
    argv = [a.format(python=sys.executable, host="127.0.0.1", port=port) for a in ide.command(JUPYTERLAB, BASE, root)]
    env = {**os.environ, TOKEN_VARIABLE: TOKEN, "JUPYTER_RUNTIME_DIR": str(root / ".runtime")}
    with open(Path(root) / "lab.log", "wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}{BASE}api/status", headers={"Authorization": f"token {TOKEN}"}).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, (Path(root) / "lab.log").read_text()[-2000:]
        time.sleep(0.2)
    yield url
    process.terminate()
    process.wait(timeout=30)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


def execute(code: str) -> dict[str, Any]:
    """A Jupyter messaging protocol execute_request, as a notebook sends it."""
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": "execute_request",
        "username": "t",
        "session": uuid.uuid4().hex,
        "version": "5.3",
        "date": "",
    }
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
    return {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}


def test_a_jupyterlab_says_when_it_was_last_used_and_a_busy_kernel_is_in_use(lab: str) -> None:
    with httpx.Client() as http:
        assert activity.last_activity(lab, BASE, TOKEN, JUPYTERLAB, http) == 0.0  # no kernel, no terminal
        started = time.time()
        headers = {"Authorization": f"token {TOKEN}"}
        kernel = http.post(f"{lab}{BASE}api/kernels", json={"name": "python3"}, headers=headers).json()
        assert activity.last_activity(lab, BASE, TOKEN, JUPYTERLAB, http) is None, "a starting kernel is in use"
        # A notebook connects to its kernel (as the browser does, through the gateway), which then goes idle.
        ws_url = f"ws{lab[4:]}{BASE}api/kernels/{kernel['id']}/channels"
        with websockets.sync.client.connect(ws_url, additional_headers=headers) as notebook:
            used = wait_for(lambda: activity.last_activity(lab, BASE, TOKEN, JUPYTERLAB, http), "an idle kernel")
            assert used >= started - 1, "an idle kernel says when it was last active"
            notebook.send(json.dumps(execute("import time; time.sleep(2)")))
            wait_for(lambda: activity.last_activity(lab, BASE, TOKEN, JUPYTERLAB, http) is None, "a busy kernel")
            after = wait_for(lambda: activity.last_activity(lab, BASE, TOKEN, JUPYTERLAB, http), "idle again", 30)
            assert after > used, "running code is activity"
        assert activity.last_activity(lab, BASE, "wrong-token", JUPYTERLAB, http) is None
        assert activity.last_activity(lab, BASE, TOKEN, spec_mod.SpaceKind.CODE_EDITOR, http) is None
        assert activity.last_activity(f"http://127.0.0.1:{free_port()}", BASE, TOKEN, JUPYTERLAB, http) is None
        http.delete(f"{lab}{BASE}api/kernels/{kernel['id']}", headers=headers)
