"""Node health: signals per node (process, Ray, agent liveness, disk, memory, GPUs, user checks) folded into a
``healthy -> suspect -> unhealthy`` verdict with hysteresis. It hands verdicts to the planner and never changes a
cluster itself (docs/resilience.md)."""
