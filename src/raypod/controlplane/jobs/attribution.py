"""Who submitted a plain ``ray job submit`` through the gateway, in a form code on the cluster cannot forge.

The gateway writes the submitter into the job's metadata; code running on the cluster can submit to its dashboard
directly with any metadata, and read every job's. So the gateway also signs the submitter with the server's key,
bound to the cluster, the submission id (which it chooses when the body has none) and what the job runs (its
entrypoint and runtime environment); the job supervisor believes a submitter only where that signature verifies.
Copying a signed job's metadata into another submission verifies for none but an identical job of the same id.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import string
import threading
from pathlib import Path
from typing import Any

from raypod import spec as spec_mod
from raypod.controlplane import keys

PROOF = "raypod.submitted_by_proof"
_ALPHABET = string.ascii_letters + string.digits


def _new_submission_id() -> str:
    return "raysubmit_" + "".join(secrets.choice(_ALPHABET) for _ in range(16))


class Attribution:
    def __init__(self, key_file: Path | None = None) -> None:
        self._key_file = key_file
        self._key: bytes | None = None if key_file else secrets.token_bytes(32)
        self._lock = threading.Lock()

    def sign(self, namespace: str, cluster: str, submission: dict[str, Any], submitter: str) -> dict[str, Any]:
        """The submission with its submitter and the proof in its metadata (whatever the body said there), and a
        submission id of Ray's form where it had none."""
        # Ray takes the deprecated job_id where submission_id is not given.
        submission_id = submission.get("submission_id") or submission.get("job_id") or _new_submission_id()
        metadata = {**(submission.get("metadata") or {}), spec_mod.SUBMITTED_BY: submitter}
        signed = {**submission, "submission_id": submission_id, "metadata": metadata}
        metadata[PROOF] = self._mac(namespace, cluster, signed, submitter)
        return signed

    def submitter(self, namespace: str, cluster: str, info: dict[str, Any]) -> str:
        """Who submitted a job Ray lists, or "" where its metadata proves no one (submitted on the cluster)."""
        metadata = info.get("metadata") or {}
        claimed, proof = str(metadata.get(spec_mod.SUBMITTED_BY, "")), str(metadata.get(PROOF, ""))
        if not claimed or not proof:
            return ""
        expected = self._mac(namespace, cluster, info, claimed)
        return claimed[:63] if hmac.compare_digest(proof.encode(), expected.encode()) else ""  # any text a job wrote

    def _mac(self, namespace: str, cluster: str, job: dict[str, Any], submitter: str) -> str:
        runs = json.dumps([job.get("entrypoint"), job.get("runtime_env") or {}], sort_keys=True, separators=(",", ":"))
        message = "\0".join((namespace, cluster, str(job.get("submission_id", "")), submitter, runs))
        return hmac.new(self._secret(), message.encode(), hashlib.sha256).hexdigest()

    def _secret(self) -> bytes:
        with self._lock:
            if self._key is None:
                assert self._key_file is not None
                self._key = keys.kept_key(self._key_file)
            return self._key
