"""The checkpoint tests' real S3-compatible server is the session's ``s3`` fixture (tests/conftest.py)."""

from __future__ import annotations

from raypod import testing

S3 = testing.S3Server
