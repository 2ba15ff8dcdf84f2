"""Hung-job detection for Ray Train: a per-node agent, progress from inside the ranks, rules, diagnostics."""
