"""Attacks from a cluster's spec on the local backend's root helpers (issue 28, findings 1 and 8): a spec's ``env``
with a ``PATH`` of fake helpers, and a server whose environment holds cloud keys. The sandbox runs for real
(unshare, mount, setpriv as root) around a shell command instead of a Ray node: what is under test is the way in,
not Ray."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from raypod import spec as spec_mod
from raypod.backends import local, privileged
from raypod.backends.local import launch as node_launch
from raypod.backends.local import records

HELPERS = ("unshare", "nsenter", "setpriv", "mount", "python3", "sh")


def fake_helpers(folder: Path, marker: Path) -> Path:
    """A folder a job could have written (its cluster's shared directory): fakes of every helper, each recording
    that it ran."""
    folder.mkdir(parents=True)
    for name in HELPERS:
        fake = folder / name
        fake.write_text(f"#!/bin/sh\necho {name} $(id -u) >> {marker}\nexit 1\n")
        fake.chmod(0o755)
    return folder


def sandbox_root() -> bool:
    return os.geteuid() == 0 and node_launch.sandbox_available()[0]


@pytest.mark.skipif(not sandbox_root(), reason="the sandbox needs root and util-linux (apt-get install util-linux)")
def test_a_specs_path_never_reaches_the_root_helpers_that_build_the_sandbox(tmp_path: Path) -> None:
    marker = tmp_path / "helpers-ran"
    evil = fake_helpers(tmp_path / "shared" / "bin", marker)
    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    temp_root = os.path.realpath(tempfile.gettempdir())
    keep = node_launch.installation_dirs_under(temp_root)
    setup = [str(cluster_dir), temp_root, str(home), str(len(keep)), *keep, "0"]
    spec_env = {"PATH": f"{evil}:/usr/bin:/bin", "LD_PRELOAD": str(evil / "evil.so"), "SPEC_VALUE": "from-spec"}
    out = cluster_dir / "out"
    command = [
        "/bin/sh",
        "-c",
        f"echo $PATH > {out}.path; echo $SPEC_VALUE > {out}.value; grep CapEff /proc/self/status > {out}.caps",
    ]
    launch = privileged.sandboxed(setup, spec_env, command, {local.CLUSTER_MARKER: "c"})
    assert launch.env == {**privileged.FIXED_ENVIRONMENT, local.CLUSTER_MARKER: "c"}
    assert all(os.path.isabs(part) for part in (launch.argv[0],))
    try:
        done = subprocess.run(
            launch.argv, env=launch.env, pass_fds=launch.pass_fds, capture_output=True, timeout=30, check=False
        )
    finally:
        launch.close()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert not marker.exists(), f"a fake helper ran: {marker.read_text()}"
    assert Path(f"{out}.value").read_text().strip() == "from-spec", "the node's command gets the spec's env"
    assert Path(f"{out}.path").read_text().startswith(str(evil)), "the spec's PATH is the node's own"
    assert Path(f"{out}.caps").read_text().split()[-1] == "0" * 16, "the node's command runs without capabilities"


@pytest.mark.skipif(not sandbox_root(), reason="the sandbox needs root and util-linux (apt-get install util-linux)")
def test_a_command_run_in_a_nodes_namespaces_gets_the_nodes_env_and_the_helpers_do_not(tmp_path: Path) -> None:
    marker = tmp_path / "helpers-ran"
    evil = fake_helpers(tmp_path / "bin", marker)
    sleeper = subprocess.Popen(["/bin/sleep", "30"])
    out = tmp_path / "out"
    try:
        launch = privileged.in_namespaces_of(
            sleeper.pid, {"PATH": f"{evil}:/usr/bin:/bin"}, ["/bin/sh", "-c", f"echo $PATH > {out}"], {}
        )
        assert launch.env == privileged.FIXED_ENVIRONMENT and launch.argv[0] == privileged.helper("nsenter")
        try:
            done = subprocess.run(launch.argv, env=launch.env, pass_fds=launch.pass_fds, timeout=30, check=False)
        finally:
            launch.close()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert done.returncode == 0
    assert not marker.exists(), f"a fake helper ran: {marker.read_text()}"
    assert out.read_text().startswith(str(evil))


def test_root_helpers_are_absolute_paths_in_the_systems_own_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/tmp/evil:" + os.environ.get("PATH", ""))
    privileged.helper.cache_clear()
    for name in ("unshare", "nsenter", "setpriv", "mount"):
        found = privileged.helper(name)
        assert os.path.isabs(found) and not found.startswith("/tmp"), found


def test_a_node_inherits_none_of_the_servers_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "server-aws-secret")
    monkeypatch.setenv("HF_TOKEN", "server-hf-token")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    backend = local.LocalBackend(tmp_path, isolation="off", env_passthrough=("HTTPS_PROXY",))
    try:
        node = spec_mod.NodeSpec(
            name="head", group="head", is_head=True, cpus=1, memory=2**30, object_store_memory=2**27,
            env={"AWS_SECRET_ACCESS_KEY": "the-clusters-own"},
        )  # fmt: skip
        record = records.NodeRecord("head", "head", True, "i" * 12, 0.0, 1, 2, 3, 4, 5, 6)
        env = backend.launcher.environment("c" * 16, node, record)
        others = spec_mod.NodeSpec(
            name="w", group="w", is_head=False, cpus=1, memory=2**30, object_store_memory=2**27
        )  # fmt: skip
        without = backend.launcher.environment("c" * 16, others, record)
    finally:
        backend.close()
    assert env["AWS_SECRET_ACCESS_KEY"] == "the-clusters-own", "a cluster's own env is its to set"
    assert "AWS_SECRET_ACCESS_KEY" not in without and "HF_TOKEN" not in without
    assert without["HTTPS_PROXY"] == "http://proxy.internal:3128", "the operator's passthrough reaches nodes"
    assert without["LC_ALL"] == "C.UTF-8" and "PATH" in without
