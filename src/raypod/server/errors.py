"""The one translation of errors into HTTP responses: RaypodError -> its status, bad requests -> 422, the
unexpected -> 500 with a request id, logged once."""

from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from raypod import errors

log = logging.getLogger(__name__)


def install(app: FastAPI) -> None:
    app.add_exception_handler(errors.RaypodError, _raypod_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)


async def _raypod_error(_request: Request, exc: errors.RaypodError) -> JSONResponse:
    return JSONResponse(exc.to_dict(), status_code=exc.http_status)


async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = []
    for err in exc.errors():
        location = ".".join(str(part) for part in err.get("loc", ()) if part != "body") or "request"
        problems.append({"field": location, "problem": str(err.get("msg", "")).removeprefix("Value error, ")})
    message = "; ".join(f"{p['field']}: {p['problem']}" for p in problems) or "invalid request"
    return JSONResponse({"code": errors.InvalidSpec.code, "message": message, "detail": problems}, status_code=422)


async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse({"code": code, "message": str(exc.detail), "detail": None}, status_code=exc.status_code)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    request_id = uuid.uuid4().hex[:12]
    log.error("unexpected error on %s %s (request %s)", request.method, request.url.path, request_id, exc_info=exc)
    return JSONResponse(
        {
            "code": "internal",
            "message": f"internal error; see the server log for request {request_id}",
            "detail": {"request_id": request_id},
        },
        status_code=500,
    )
