"""How an agent whose node shares no directory with the control plane (a Kubernetes pod) hands over what it
writes: each poll it sends ``status.json`` and the detections it has not sent yet to the control plane, with its
cluster's agent credential, and writes the requests the answer carries into ``requests/``, where it acts on
them as on a local node. An unreachable control plane costs nothing but the report: the agent detects and
cancels on its own."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import httpx

from raypod.capabilities.hangwatch import addons, layout

log = logging.getLogger("raypod.hangwatch")

MAX_DETECTIONS = 16  # per report: the control plane takes no more (the rest go with the next ones)
REQUEST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}\.json$")


class Reporter:
    def __init__(self, root: Path, url: str, token: str, ca_file: str | None = None) -> None:
        self.root = root
        self.url = url
        self._headers = {"Authorization": f"Bearer {token}"}
        self._client = httpx.Client(timeout=10.0, verify=ca_file or True)
        self._sent: dict[str, float] = {}  # detection file -> its mtime when it was sent

    @classmethod
    def from_environment(cls, root: Path) -> Reporter | None:
        """The reporter the node's add-ons asked for; None where the control plane reads this directory itself."""
        url = os.environ.get(addons.REPORT_URL_VARIABLE)
        token = os.environ.get(addons.REPORT_TOKEN_VARIABLE)
        if not url or not token:
            return None
        return cls(root, url, token, os.environ.get(addons.REPORT_CA_VARIABLE))

    def report(self) -> int:
        """Send one report; returns how many requests came back (written into ``requests/``)."""
        detections: dict[str, object] = {}
        pending: dict[str, float] = {}
        folder = layout.detections_dir(self.root)
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            mtime = path.stat().st_mtime
            data = layout.read_json(path)
            if self._sent.get(path.name) == mtime or data is None:
                continue
            detections[path.name], pending[path.name] = data, mtime
            if len(detections) >= MAX_DETECTIONS:
                break
        body = {"status": layout.read_json(self.root / "status.json"), "detections": detections}
        try:
            answer = self._client.post(self.url, json=body, headers=self._headers)
            answer.raise_for_status()
            requests = answer.json().get("requests") or {}
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.warning("cannot report to the control plane (%s): detecting and acting here all the same", exc)
            return 0
        self._sent.update(pending)
        written = 0
        for name, request in requests.items() if isinstance(requests, dict) else []:
            if REQUEST_NAME.match(str(name)) and isinstance(request, dict):
                layout.write_json(self.root / "requests" / str(name), request)
                written += 1
        return written

    def close(self) -> None:
        self._client.close()
