"""The Python start-up of a local node's processes (``backends/local/node_python/sitecustomize.py``): ``import ray``
no longer pays for compiling rfc3987_syntax's grammars, jsonschema still checks ``iri`` with it (loaded on first
use), and a sitecustomize it shadows still runs. Real interpreters, the node's PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raypod.backends import local

pytest.importorskip("rfc3987_syntax", reason="only environments with rfc3987-syntax (JupyterLab's) pay the cost")


def run(code: str, *extra_path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([local.NODE_PYTHON_DIR, *map(str, extra_path)])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_importing_ray_defers_the_grammar_compilation_and_iri_checks_still_work() -> None:
    out = run(
        "import sys, ray\n"
        "print('compiled' if 'rfc3987_syntax.syntax_helpers' in sys.modules else 'deferred')\n"
        "from jsonschema import Draft7Validator\n"
        "checker = Draft7Validator({'format': 'iri'}, format_checker=Draft7Validator.FORMAT_CHECKER)\n"
        "print(checker.is_valid('https://example.com/ä'), checker.is_valid('not an iri :: %%'))\n"
    )
    assert out.split() == ["deferred", "True", "False"]


def test_a_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.SHADOWED_RAN = True\n")
    assert run("import builtins\nprint(getattr(builtins, 'SHADOWED_RAN', False))", tmp_path).strip() == "True"
