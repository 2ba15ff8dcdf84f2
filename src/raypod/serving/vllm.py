"""The GPU path: a catalog model on Ray Serve LLM (vLLM), its weights staged by raypod's loader, and LMCache as
vLLM's KV offload (node CPU memory, then a shared Redis), configured from the same deployment settings as the CPU
engine.

``llm_config`` is pure (a dict for ``ray.serve.llm.LLMConfig``) and is unit-tested without a GPU; importing this
module needs Ray's LLM callback base, which imports without vLLM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase

from raypod.serving import catalog, loader

LMCACHE_CONNECTOR = "LMCacheConnectorV1"


class StagingCallback(CallbackBase):
    """Stages the model with raypod's loader (parallel, resumable, checksummed) instead of Ray's own download."""

    async def on_before_node_init(self) -> None:
        entry = catalog.ModelEntry.model_validate(self.kwargs["entry"])
        path = loader.stage(entry)
        self.ctx.run_init_node = False
        self.ctx.custom_data["raypod_model_dir"] = str(path)

    async def on_after_node_init(self) -> None:
        return None


def llm_config(
    entry: catalog.ModelEntry,
    *,
    model_cache: str,
    replicas: int = 1,
    autoscale: tuple[int, int] | None = None,
    l1_bytes: int = 0,
    l2_url: str | None = None,
    chunk_tokens: int = 256,
    accelerator_type: str | None = None,
) -> dict[str, Any]:
    """``LLMConfig`` keyword arguments. ``model_cache`` is the node-local directory the loader stages into (the
    same path on every node, so vLLM reads the staged copy)."""
    env = {
        loader.CACHE_VARIABLE: model_cache,
        "LMCACHE_CHUNK_SIZE": str(chunk_tokens),
        "LMCACHE_LOCAL_CPU": "True" if l1_bytes else "False",
        "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{l1_bytes / 2**30:.3f}",  # LMCache reads GB
    }
    if l2_url:
        env["LMCACHE_REMOTE_URL"] = l2_url
        env["LMCACHE_REMOTE_SERDE"] = "naive"
    scaling: dict[str, Any] = (
        {"autoscaling_config": {"min_replicas": autoscale[0], "max_replicas": autoscale[1]}}
        if autoscale
        else {"num_replicas": replicas}
    )
    config: dict[str, Any] = {
        "model_loading_config": {
            "model_id": entry.id,
            "model_source": str(loader.staged_dir(entry, root=Path(model_cache))),
        },
        "engine_kwargs": {
            "dtype": entry.dtype,
            "max_model_len": entry.max_context,
            "kv_transfer_config": {"kv_connector": LMCACHE_CONNECTOR, "kv_role": "kv_both"},
        },
        "deployment_config": scaling,
        "runtime_env": {"env_vars": env},
        "callback_config": {
            "callback_class": f"{__name__}.StagingCallback",
            "callback_kwargs": {"entry": entry.model_dump(mode="json")},
        },
    }
    if accelerator_type:
        config["accelerator_type"] = accelerator_type
    return config
