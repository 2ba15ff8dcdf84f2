"""The vLLM + LMCache path's configuration (no GPU here, so vLLM itself never runs in these tests): the LLMConfig
Ray Serve LLM validates, with raypod's loader as its model callback and LMCache as vLLM's KV connector."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from raypod.serving import catalog, loader


def test_the_llm_config_stages_with_raypods_loader_and_offloads_kv_to_lmcache(tiny_model: Path) -> None:
    vllm = pytest.importorskip("raypod.serving.vllm")
    entry = catalog.inspect(catalog.ModelSource(id="llama-tiny", source=str(tiny_model)))
    config = vllm.llm_config(
        entry, model_cache="/var/cache/models", autoscale=(1, 3), l1_bytes=4 * 2**30, l2_url="redis://kv:6379"
    )
    assert config["model_loading_config"] == {
        "model_id": "llama-tiny",
        "model_source": str(loader.staged_dir(entry, Path("/var/cache/models"))),
    }
    assert config["engine_kwargs"]["kv_transfer_config"] == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    env = config["runtime_env"]["env_vars"]
    assert env["LMCACHE_LOCAL_CPU"] == "True" and float(env["LMCACHE_MAX_LOCAL_CPU_SIZE"]) == 4.0
    assert env["LMCACHE_REMOTE_URL"] == "redis://kv:6379" and env[loader.CACHE_VARIABLE] == "/var/cache/models"
    assert config["deployment_config"]["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3}
    callback = config["callback_config"]
    assert callback["callback_class"] == "raypod.serving.vllm.StagingCallback"
    assert catalog.ModelEntry.model_validate(callback["callback_kwargs"]["entry"]) == entry


def test_ray_serve_llm_accepts_the_config_where_its_llm_module_imports(tiny_model: Path) -> None:
    """``ray.serve.llm`` needs vLLM (a GPU machine); where it imports, LLMConfig must take raypod's dict as is."""
    llm = pytest.importorskip("ray.serve.llm", reason="needs vLLM (a GPU machine)", exc_type=ImportError)
    vllm = pytest.importorskip("raypod.serving.vllm")
    entry = catalog.inspect(catalog.ModelSource(id="llama-tiny", source=str(tiny_model)))
    llm.LLMConfig(**vllm.llm_config(entry, model_cache="/tmp/models"))


def test_the_staging_callback_stages_and_skips_rays_own_download(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm = pytest.importorskip("raypod.serving.vllm")
    monkeypatch.setenv(loader.CACHE_VARIABLE, str(tmp_path / "cache"))
    entry = catalog.inspect(catalog.ModelSource(id="llama-tiny", source=str(tiny_model)))
    callback = vllm.StagingCallback(llm_config=None, entry=entry.model_dump(mode="json"))
    asyncio.run(callback.on_before_node_init())
    assert callback.ctx.run_init_node is False
    staged = Path(callback.ctx.custom_data["raypod_model_dir"])
    assert (staged / "model.safetensors").read_bytes() == (tiny_model / "model.safetensors").read_bytes()
