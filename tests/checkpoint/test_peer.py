"""The peer tier on a real multi-node Ray cluster (ray.cluster_utils: real raylets on this host): a node lost with
its memory and disk restores from the replica on another node, then from durable storage."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from raypod.checkpoint import CheckpointManager, Retention

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SMALL = {"num_cpus": 1, "object_store_memory": 100 * 2**20}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started = Cluster(initialize_head=True, head_node_args=SMALL)
    started.add_node(**SMALL, resources={"node_a": 1})
    started.add_node(**SMALL, resources={"node_b": 1})
    ray.init(address=started.address)
    try:
        yield started
    finally:
        ray.shutdown()
        started.shutdown()


class Trainer:
    """A training process on one node; its state is a function of the step, so any restore can be checked."""

    def __init__(self, local_dir: str, durable_url: str) -> None:
        self.manager = CheckpointManager(
            "peer-run", local_dir, durable_url, peer=True, retention=Retention(memory=1, peer=2)
        )

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def train(self, steps: list[int]) -> tuple[dict[str, list[int]], dict[str, str]]:
        import torch

        for step in steps:
            self.manager.save({"w": torch.full((256, 256), float(step)), "step": step}, step)
        self.manager.wait()
        return self.manager.available(), dict(self.manager.errors)

    def restore(self) -> tuple[int, str, float, dict[str, str]]:
        restored = self.manager.restore()
        assert restored is not None
        return restored.step, restored.tier, float(restored.state["w"][0, 0]), restored.skipped

    def drop_peer(self) -> None:
        self.manager.drop_peer()


def peer_node(name: str = "raypod-ckpt-peer-run-0") -> Any:
    from ray.util.state import list_actors

    alive = list_actors(filters=[("state", "=", "ALIVE")])
    actor = next((a for a in alive if a.name == name), None)
    assert actor is not None, [(a.name, a.class_name) for a in alive]
    return actor.node_id


def test_losing_a_node_restores_from_the_peer_replica_then_from_durable(cluster: Cluster, tmp_path: Path) -> None:
    remote = ray.remote(num_cpus=0)(Trainer)
    durable = f"file://{tmp_path / 'durable'}"
    first = remote.options(resources={"node_a": 0.01}, max_restarts=0).remote(str(tmp_path / "node-a"), durable)
    available, errors = ray.get(first.train.remote([1, 2, 3]))
    assert errors == {}
    assert available["peer"] == [2, 3] and available["disk"][-1] == 3
    node_a = ray.get(first.node_id.remote())
    assert peer_node() != node_a, "the replica must live on another node"

    doomed = next(node for node in cluster.worker_nodes if node.node_id == node_a)
    cluster.remove_node(doomed)  # the node, its memory tier and its process are gone
    shutil.rmtree(tmp_path / "node-a")  # and so is its disk

    second = remote.options(resources={"node_b": 0.01}).remote(str(tmp_path / "node-b"), durable)
    step, tier, value, _ = ray.get(second.restore.remote())
    assert (step, tier, value) == (3, "peer", 3.0)

    ray.get(second.drop_peer.remote())  # the replica is lost too: durable storage remains
    step, tier, value, _ = ray.get(second.restore.remote())
    assert (step, tier, value) == (3, "durable", 3.0)
