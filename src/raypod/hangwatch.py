"""Hang detection settings and pauses from inside a Ray Train ``train_func`` (docs/hangwatch.md).

``configure`` validates its rules everywhere and raises ``ValueError`` on a bad one; where no raypod agent
follows the run (plain Ray), it is otherwise a no-op with one warning, so the same script runs anywhere::

    import raypod.hangwatch

    def train_func(config):
        raypod.hangwatch.configure(rules=[{"name": "step", "log_pattern": r"step \\d+", "timeout_minutes": 5}],
                                   action="cancel")
        ...
        with raypod.hangwatch.paused("evaluation"):
            evaluate()
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from raypod.capabilities.hangwatch import worker

__all__ = ["configure", "paused"]

_warned = False


def configure(
    rules: list[dict[str, Any]] | str | None = None,
    *,
    action: str | None = None,
    timeout: float | str | None = None,
    start_timeout: float | str | None = None,
    max_hang_restarts: int | None = None,
    enabled: bool | None = None,
) -> None:
    """Set this run's hang detection: ``rules`` (toolkit-style dicts, or YAML/JSON text), ``action``
    (``notify``/``cancel``), ``timeout`` (seconds, ``'15m'`` or ``'adaptive'``), ``start_timeout``.

    Raises:
        ValueError: a bad rule or setting; the message names the rule and the field.
    """
    # The spec's validation is loaded here, not with this module: the checkpoint library imports this module into
    # every training process, which should not pay for raypod's whole vocabulary (pydantic models, YAML).
    from raypod import spec as spec_mod

    data: dict[str, Any] = {}
    if rules is not None:
        parsed = spec_mod.load_hang_rules(rules) if isinstance(rules, str) else rules
        data["rules"] = [r.model_dump() if isinstance(r, spec_mod.HangRuleSpec) else r for r in parsed]
    for key, value in (
        ("action", action),
        ("timeout", timeout),
        ("start_timeout", start_timeout),
        ("max_hang_restarts", max_hang_restarts),
        ("enabled", enabled),
    ):
        if value is not None:
            data[key] = value
    overrides = spec_mod.parse_hang_overrides(data)
    recorder = worker.current()
    if recorder is None:
        _warn_once()
        return
    recorder.configure(overrides.model_dump(mode="json", exclude_unset=True))


@contextlib.contextmanager
def paused(reason: str = "paused by the training script") -> Iterator[None]:
    """Stop this rank's hang timers for the block (an evaluation, a long save); they resume where they were."""
    recorder = worker.current()
    if recorder is None:
        yield
        return
    recorder.pause(reason[:200])
    try:
        yield
    finally:
        recorder.resume()


def _warn_once() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "raypod.hangwatch: no raypod agent follows this process (not a Ray Train worker on a raypod node); "
            "the settings are valid and have no effect",
            stacklevel=3,
        )
