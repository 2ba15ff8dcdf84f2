"""Capabilities beside the core control plane: one package each. A capability never imports the control plane
or the server; it reads views and hands back data or verdicts."""
