"""The shape of the package (docs/architecture.md): backends know no capability and nothing above them, the
code that runs inside every Ray training process stays light, and no module grows past what one reads at once."""

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


def test_only_the_store_speaks_sql() -> None:
    """Tables and queries live under controlplane/store/ (one module per noun): services speak in views."""
    offenders = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if any(m == "sqlalchemy" or m.startswith("sqlalchemy.") for m in imported_modules(path))
        and not str(path.relative_to(SRC)).startswith(("controlplane/store/", "controlplane/migrations/"))
    )
    assert offenders == []


MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    """A module a newcomer can read in one sitting: past 600 lines, split it by concern (issue 30)."""
    over = {
        str(path.relative_to(SRC)): lines
        for path in SRC.rglob("*.py")
        if "migrations" not in path.parts and (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert over == {}


def test_the_server_asks_services_and_never_reaches_into_their_store_or_backend() -> None:
    """Routes, pages and the gateway call one service verb each; what a service keeps is its own (issue 30)."""
    offenders = {}
    for path in (SRC / "server").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("store", "backend", "engine"):
                offenders.setdefault(str(path.relative_to(SRC)), []).append(node.lineno)
    assert offenders == {}
