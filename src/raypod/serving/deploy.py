"""The Ray job the control plane submits to deploy or delete a model's Serve application on a cluster:
``python -m raypod.serving.deploy <base64 JSON of a DeployRequest>``.

Serve runs with the cluster's own HTTP port on the head only (several clusters share a host); an unchanged
``serve.run`` script later finds this Serve and adds its application next to the models.
"""

from __future__ import annotations

import base64
import sys
from typing import Any

from raypod.serving.settings import DeployRequest


def encode(request: DeployRequest) -> str:
    return base64.urlsafe_b64encode(request.model_dump_json().encode()).decode()


def main(argv: list[str]) -> int:
    import ray
    from ray import serve

    request = DeployRequest.model_validate_json(base64.urlsafe_b64decode(argv[1]))
    ray.init(address="auto", log_to_driver=True)
    if request.action == "delete":
        serve.delete(request.name)
        print(f"deleted Serve application {request.name}")
        return 0
    serve.start(http_options={"host": "127.0.0.1", "port": request.http_port}, proxy_location="HeadOnly")
    serve.run(application(request), name=request.name, route_prefix=f"/{request.name}")
    print(f"Serve application {request.name} is running")
    return 0


def application(request: DeployRequest) -> Any:
    """The Serve application of a deploy request: raypod's CPU engine, or vLLM through Ray Serve LLM."""
    assert request.settings is not None
    if request.engine == "vllm":
        from ray.serve.llm import LLMConfig, build_openai_app

        from raypod.serving import loader, vllm

        config = vllm.llm_config(
            request.settings.entry,
            model_cache=str(loader.cache_root()),
            replicas=request.options.get("num_replicas", 1),
            l1_bytes=request.settings.l1_bytes,
            l2_url=request.settings.l2_url or _read(request.settings.l2_url_file),
            chunk_tokens=request.settings.chunk_tokens,
        )
        return build_openai_app({"llm_configs": [LLMConfig(**config)]})
    from raypod.serving import openai_app

    return openai_app.deployment(request.settings, request.options)


def build(args: dict[str, Any]) -> Any:
    """An application builder for a Serve config file (``import_path: raypod.serving.deploy:build``, ``args``: a
    DeployRequest), as KubeRay's RayService runs it."""
    return application(DeployRequest.model_validate(args))


def _read(path: str | None) -> str | None:
    if not path:
        return None
    with open(path) as handle:
        return handle.read().strip() or None


if __name__ == "__main__":
    sys.exit(main(sys.argv))
