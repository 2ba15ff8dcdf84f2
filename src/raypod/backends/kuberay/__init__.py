"""KubeRay: pure manifest builders now; the Kubernetes backend builds on them."""

__all__ = ["manifests"]
