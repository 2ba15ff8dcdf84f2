"""Workspaces: an IDE (JupyterLab, or code-server for the code editor) on a zero-compute Ray node of a cluster, so
``ray.init(address="auto")`` in a notebook makes it a driver of that cluster; reached through raypod's gateway at
``/spaces/<namespace>/<name>/``. A backend runs the IDE beside the node's raylet (``ide``); the control plane keeps
workspaces in the cluster's spec (``ClusterSpec.spaces``), so the reconcile loop starts and replaces their nodes
as it does any other."""
