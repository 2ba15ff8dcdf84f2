"""The gateway: raypod's authenticated reverse proxy to each cluster's dashboard, job API and Serve applications
(``clusters``), to workspaces' IDEs (``spaces``), and the pages' own origins (``origin_routes``); ``forward`` and
``sockets`` are what they share."""

from fastapi import APIRouter

from raypod.server.gateway import clusters, spaces
from raypod.server.gateway.clusters import RouteCache, http_route
from raypod.server.gateway.forward import ConcurrencyLimit
from raypod.server.gateway.origin_routes import OriginDispatch
from raypod.server.gateway.spaces import space_http_route

router = APIRouter(tags=["gateway"])
router.include_router(clusters.router)
router.include_router(spaces.router)

__all__ = ["ConcurrencyLimit", "OriginDispatch", "RouteCache", "http_route", "router", "space_http_route"]
