"""The command-line interface: a thin layer over ``raypod.Client``."""

__all__: list[str] = []
