"""The direction of imports (docs/architecture.md): backends know no capability and nothing above them, and the
code that runs inside every Ray training process stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "raypod"


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_backends_import_no_capability_nor_anything_above_them() -> None:
    above = ("raypod.capabilities", "raypod.controlplane", "raypod.server", "raypod.client", "raypod.cli")
    offenders = {
        str(path.relative_to(SRC)): sorted(m for m in imported_modules(path) if m.startswith(above))
        for path in (SRC / "backends").rglob("*.py")
    }
    assert {path: found for path, found in offenders.items() if found} == {}


def test_the_checkpoint_library_loads_no_server_code_into_training_processes() -> None:
    """`import raypod.checkpoint` runs in every Ray Train worker: not the spec, the web framework nor the store."""
    code = (
        "import sys, raypod.checkpoint\n"
        "print(sorted(m for m in ('raypod.spec', 'fastapi', 'sqlalchemy', 'raypod.controlplane') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.strip() == "[]", loaded.stdout + loaded.stderr
