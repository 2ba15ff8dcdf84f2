"""Backends by name. The mapping is explicit: a backend is never looked up by reflection."""

from __future__ import annotations

from collections.abc import Callable

from raypod import config, errors
from raypod.backends import base


def _local(settings: config.Settings) -> base.Backend:
    from raypod.backends.local import LocalBackend

    return LocalBackend(
        settings.home,
        fast_health_checks=settings.fast_health_checks,
        isolation=settings.isolation,
        env_passthrough=settings.node_env_passthrough,
    )


def _fake(settings: config.Settings) -> base.Backend:
    from raypod.backends.fake import FakeBackend

    return FakeBackend()


def _kuberay(settings: config.Settings) -> base.Backend:
    try:
        from raypod.backends.kuberay.backend import KubeRayBackend
    except ImportError:
        raise errors.InvalidSpec(
            "the kuberay backend needs the Kubernetes client: pip install 'raypod[kubernetes]'"
        ) from None
    return KubeRayBackend.from_environment(kueue=settings.kueue)


FACTORIES: dict[str, Callable[[config.Settings], base.Backend]] = {"local": _local, "fake": _fake, "kuberay": _kuberay}


def create_backend(settings: config.Settings) -> base.Backend:
    """Build the backend named in the settings.

    Raises:
        InvalidSpec: unknown backend name.
    """
    factory = FACTORIES.get(settings.backend)
    if factory is None:
        raise errors.InvalidSpec(f"unknown backend '{settings.backend}' (choose from: {', '.join(FACTORIES)})")
    return factory(settings)


__all__ = ["FACTORIES", "create_backend"]
