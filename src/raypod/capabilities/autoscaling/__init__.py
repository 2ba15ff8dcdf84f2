"""Autoscaling: a cluster's groups sized from its Ray's demand by Ray's own scheduler (docs/autoscaling.md)."""
