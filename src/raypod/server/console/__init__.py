"""The web console: server-rendered pages at ``/``, behind the same login as the API and the gateway.

Pages are Jinja templates made of named regions; the page script refreshes regions by asking the same URL
with ``?regions=1``, so a page and its live updates always render from the same code. Every change goes
through the public API (``/api/v1``) with the session's CSRF token, so the console can do nothing the API
cannot.
"""

from raypod.server.console.pages import STATIC_DIR, install, router

__all__ = ["STATIC_DIR", "install", "router"]
