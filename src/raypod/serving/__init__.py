"""Serving on Ray Serve: a model catalog, a loader that stages weights onto nodes, an OpenAI-compatible app on a
CPU engine (transformers) or vLLM, and a tiered KV cache a user's own deployment can adopt.

Modules here run inside Ray processes (replicas, staging tasks): they import Ray, torch and transformers lazily,
and nothing from the control plane.
"""
