"""A small Ray job: one task per CPU, reporting which node group ran it."""

import collections
import socket
import time

import ray

ray.init()


@ray.remote(num_cpus=1)
def where(i: int) -> str:
    time.sleep(0.5)
    return ray.get_runtime_context().get_node_labels().get("ray.io/node-group", socket.gethostname())


cpus = int(ray.cluster_resources().get("CPU", 1))
counts = collections.Counter(ray.get([where.remote(i) for i in range(cpus * 2)]))
print(f"{len(ray.nodes())} nodes, {cpus} CPUs; tasks per node group: {dict(counts)}")
