"""Serving's commands: the model catalog (``raypod model``) and deployments on a cluster's Ray Serve
(``raypod serve``)."""

from raypod.cli.serving import deployments, models

__all__ = ["deployments", "models"]
