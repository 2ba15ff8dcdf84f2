"""A detached actor on a worker node that counts: its count and pid show whether it survived a head restart.

Usage: python counter_script.py create|get   (RAY_ADDRESS and the cluster's Ray token in the environment)
"""

from __future__ import annotations

import os
import sys

import ray


@ray.remote(num_cpus=1)
class Counter:
    def __init__(self) -> None:
        self.count = 0

    def increment(self) -> tuple[int, int]:
        self.count += 1
        return self.count, os.getpid()


def main() -> None:
    ray.init()
    if sys.argv[1] == "create":
        counter = Counter.options(name="counter", namespace="chaos", lifetime="detached").remote()  # type: ignore[attr-defined]
    else:
        counter = ray.get_actor("counter", namespace="chaos")
    count, pid = ray.get(counter.increment.remote(), timeout=120)
    print(f"COUNT {count} PID {pid}", flush=True)


if __name__ == "__main__":
    main()
