"""create_app(settings): the raypod API server, with the reconcile loop running beside it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from fastapi import FastAPI

import raypod
from raypod import config
from raypod.backends import base
from raypod.controlplane.plane import ControlPlane
from raypod.server import audit, console, gateway, limits, origins
from raypod.server import errors as server_errors
from raypod.server.routes import audit as audit_routes
from raypod.server.routes import clusters, identities, observability
from raypod.server.routes import governance as governance_routes
from raypod.server.routes import hangwatch as hangwatch_routes
from raypod.server.routes import jobs as job_routes
from raypod.server.routes import schedules as schedule_routes
from raypod.server.routes import serving as serving_routes
from raypod.server.routes import spaces as space_routes
from raypod.server.routes import sso as sso_routes

log = logging.getLogger(__name__)


SERVICES = (
    "identities",
    "clusters",
    "governance",
    "jobs",
    "serving",
    "spaces",
    "monitoring",
    "hangs",
    "audit",
    "schedules",
    "sso",
    "reconciler",
)


def create_app(settings: config.Settings, backend: base.Backend | None = None) -> FastAPI:
    """Build the app; the store, backend and loop open on startup and close on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        config.secure_home(settings.home)
        app.state.origins = origins.Origins.load(settings.home, settings.origin_domain, secure=settings.tls)
        plane = ControlPlane.open(settings, backend)
        app.state.control_plane = plane
        app.state.settings = settings
        for part in SERVICES:  # what routes.part(name) reaches
            setattr(app.state, part, getattr(plane, part))
        app.state.gateway_routes = gateway.RouteCache(plane.clusters)
        # aiohttp, not httpx, for the proxy hop: it adds about half the latency per request here.
        app.state.gateway_limit = gateway.ConcurrencyLimit(settings.gateway_max_in_flight)
        app.state.gateway_http = aiohttp.ClientSession(
            # No total: a log stream or long poll may last; but no upstream may connect slowly or fall silent.
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=settings.gateway_connect_timeout_s,
                sock_connect=settings.gateway_connect_timeout_s,
                sock_read=settings.gateway_read_timeout_s,
            ),
            connector=aiohttp.TCPConnector(limit=256, keepalive_timeout=60),
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        plane.start()
        try:
            yield
        finally:
            await app.state.gateway_http.close()
            plane.close()

    app = FastAPI(
        title="raypod",
        version=raypod.__version__,
        description="Ray clusters without YAML: create, scale, inspect and delete real Ray clusters.",
        lifespan=lifespan,
    )
    server_errors.install(app)
    app.add_middleware(
        limits.BodyLimit,
        json_limit=settings.max_json_body_bytes,
        upload_limit=settings.max_upload_bytes,
        proxied_limit=settings.gateway_max_body_bytes,
    )
    # A request to a cluster's or workspace's own origin never reaches the console's routes.
    app.add_middleware(gateway.OriginDispatch, proxied_limit=settings.gateway_max_body_bytes)
    # Outermost: every change anyone asks for, wherever it goes, is in the audit log.
    app.add_middleware(audit.AuditTrail)
    app.include_router(clusters.router)
    app.include_router(identities.router)
    app.include_router(job_routes.router)
    app.include_router(hangwatch_routes.router)
    app.include_router(audit_routes.router)
    app.include_router(schedule_routes.router)
    app.include_router(serving_routes.router)
    app.include_router(space_routes.router)
    app.include_router(governance_routes.router)
    app.include_router(observability.router)
    app.include_router(identities.login_router)
    app.include_router(sso_routes.router)
    app.include_router(sso_routes.login_router)
    app.include_router(gateway.router)
    console.install(app)
    app.router.routes.append(gateway.http_route)
    app.router.routes.append(gateway.space_http_route)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Public: liveness of the API server."""
        return {"status": "ok", "version": raypod.__version__}

    return app
