"""Workspaces: an IDE on a zero-compute node of a cluster."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, field_validator

from raypod.spec.values import (
    SPACE_GROUP,
    ByteSize,
    Strict,
    WorkspaceName,
)


class SpaceKind(StrEnum):
    JUPYTERLAB = "jupyterlab"
    CODE_EDITOR = "code-editor"


class SpaceSpec(Strict):
    """A workspace: an IDE on a zero-compute Ray node of the cluster, so its kernels are drivers of the cluster."""

    name: WorkspaceName = Field(description="Workspace name (DNS-1123 label, unique in its namespace).")
    kind: SpaceKind = SpaceKind.JUPYTERLAB
    running: bool = Field(True, description="False: stopped; its node is gone, its files are kept.")
    owner: str | None = Field(None, max_length=128, description="Who may open it, besides team admins.")
    memory: ByteSize = Field(2**30, description="Memory Ray schedules against on the workspace's node.")
    python_env: str | None = Field(
        None,
        max_length=1024,
        description="A Python environment (its directory, e.g. a venv) whose interpreter runs the notebook kernels: "
        "the user's own packages, with ipykernel and the cluster's Ray version (JupyterLab only).",
    )

    @field_validator("python_env")
    @classmethod
    def _python_env(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or "\0" in value or "/../" in f"{value}/"):
            raise ValueError("an absolute path of a Python environment's directory, such as /opt/envs/ml")
        return value

    def node_name(self) -> str:
        return f"{SPACE_GROUP}-{self.name}"
