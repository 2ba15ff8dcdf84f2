"""The application builder a RayService's Serve config names (``raypod.serving.deploy:build``): the same
application the deploy job runs on a cluster, from the DeployRequest in the config's ``args``."""

from __future__ import annotations

from pathlib import Path

from raypod.serving import catalog, deploy
from raypod.serving.settings import DeployRequest, ServeSettings


def test_the_builder_makes_the_model_application_with_its_options(tiny_model: Path) -> None:
    import warnings

    with warnings.catch_warnings():  # Ray Serve's own pydantic fields warn on import; not this code's to fix
        warnings.simplefilter("ignore", DeprecationWarning)
        from ray.serve import Application

    entry = catalog.inspect(catalog.ModelSource(id="tiny", source=str(tiny_model)))
    request = DeployRequest(
        action="deploy",
        name="chat",
        engine="cpu",
        settings=ServeSettings(entry=entry, reserve_tokens=64),
        options={"num_replicas": 2, "max_ongoing_requests": 2},
    )
    app = deploy.build(request.model_dump(mode="json"))
    assert isinstance(app, Application)
    deployment = app._bound_deployment
    assert deployment.num_replicas == 2 and deployment.max_ongoing_requests == 2
    [settings] = app._bound_deployment.init_args
    assert ServeSettings.model_validate(settings).reserve_tokens == 64
