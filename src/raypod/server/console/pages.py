"""Console routes: pages (GET, HTML), their live regions (``?regions=1``, JSON of HTML) and the two
form/manifest conversions the create form uses."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import jinja2
import yaml
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

import raypod
from raypod import errors, state
from raypod import spec as spec_mod
from raypod.backends.kuberay import manifests
from raypod.controlplane import identity, store
from raypod.controlplane.plane import ControlPlane
from raypod.server import audit, auth
from raypod.server.console import views
from raypod.server.routes.clusters import NamePath
from raypod.server.routes.jobs import JobIdPath

STATIC_DIR = Path(__file__).parent / "static"
TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
# Scripts and styles come only from raypod itself; pages cannot be framed.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
EVENTS_SHOWN = 100
# Filter boxes may be left empty or hold anything typed; pages answer with what matches, not a 422.
FilterQuery = Annotated[str | None, Query(max_length=63)]


class LoginRequired(Exception):
    """A page was asked for without credentials: send the browser to the login page, then back."""

    def __init__(self, next_url: str) -> None:
        self.next_url = next_url


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_exception_handler(LoginRequired, _to_login)  # type: ignore[arg-type]


async def _to_login(_request: Request, exc: LoginRequired) -> RedirectResponse:
    return RedirectResponse(f"/login?next={quote(exc.next_url, safe='/')}", status_code=303)


def _viewer(request: Request) -> identity.Principal:
    """The caller of a page. A page request without credentials goes to the login page; a region request
    (from the page script) gets a 401 it can act on."""
    try:
        principal = auth.authenticate(request)
    except errors.Unauthenticated:
        if request.query_params.get("regions"):
            raise
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target) from None
    request.state.principal = principal
    return principal


def _render(
    request: Request,
    principal: identity.Principal | None,
    template: str,
    regions: tuple[str, ...] = (),
    status_code: int = 200,
    **context: Any,
) -> Response:
    context.update(
        user=principal.user if principal else None,
        is_admin=bool(principal and principal.is_admin),
        csrf=(principal.session_csrf or "") if principal else "",
        version=raypod.__version__,
        path=request.url.path,
    )
    if regions and request.query_params.get("regions"):
        rendered = {region: TEMPLATES.get_template(f"_{region}.html").render(context) for region in regions}
        return JSONResponse(rendered, headers={"Cache-Control": "no-store"})
    html = TEMPLATES.get_template(template).render(context)
    return HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)


class _PageRoute(APIRoute):
    """A page whose service call fails (unknown cluster, no access) renders the error page instead of JSON;
    its regions answer JSON, which the page script acts on."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page_or_error(request: Request) -> Response:
            try:
                return await handler(request)
            except errors.RaypodError as exc:
                principal = getattr(request.state, "principal", None)
                if principal is None or request.method != "GET" or request.query_params.get("regions"):
                    raise
                return _render(request, principal, "error.html", status_code=exc.http_status, message=exc.message)

        return page_or_error


router = APIRouter(include_in_schema=False, route_class=_PageRoute)


def _plane(request: Request) -> ControlPlane:
    plane: ControlPlane = request.app.state.control_plane
    return plane


def _name_filter(value: str | None) -> str | None:
    """A filter box's value: empty means no filter, and a name that cannot exist matches nothing."""
    if not value:
        return None
    return value if spec_mod.is_dns_label(value) else "-"


def _namespaces(request: Request, principal: identity.Principal) -> list[str]:
    """Namespaces the caller may create clusters in."""
    ids: identity.IdentityService = request.app.state.identities
    return [ns.name for ns in ids.list_namespaces() if principal.is_admin or ns.team in principal.teams]


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/") -> Response:
    """Public: the token login form, and single sign-on's button where it is configured. ``next`` must be a path
    on this server (no open redirect)."""
    return _login(request, auth.same_origin_path(next))


def _login(request: Request, next_url: str, error: str = "", status_code: int = 200) -> Response:
    sso = _plane(request).sso
    sso_name = sso.settings.display_name if sso is not None else ""
    return _render(
        request, None, "login.html", status_code=status_code, next_url=next_url, sso_name=sso_name, error=error
    )


SSO_BINDING_COOKIE = "raypod_sso_login"


@router.get("/login/sso")
def sso_login(request: Request, next: str = "/") -> Response:
    """Public: off to the provider (authorization code flow with PKCE); a cookie binds the login to this browser.
    SameSite=Lax: the provider's redirect back is a cross-site navigation, which a Strict cookie would miss."""
    sso = _plane(request).sso
    if sso is None:
        return _login(request, "/", "Single sign-on is not configured on this server.", 404)
    try:
        url, binding = sso.begin_login(auth.same_origin_path(next))
    except errors.RaypodError as exc:
        return _login(request, auth.same_origin_path(next), exc.message, exc.http_status)
    response = RedirectResponse(url, status_code=303)
    secure = request.url.scheme == "https"
    response.set_cookie(
        SSO_BINDING_COOKIE, binding, httponly=True, secure=secure, samesite="lax", max_age=600, path="/login/sso"
    )
    return response


@router.get("/login/sso/callback")
def sso_callback(
    request: Request,
    state: Annotated[str, Query(max_length=512)] = "",
    code: Annotated[str, Query(max_length=4096)] = "",
    error: Annotated[str, Query(max_length=200)] = "",
    error_description: Annotated[str, Query(max_length=500)] = "",
    iss: Annotated[str | None, Query(max_length=512)] = None,
) -> Response:
    """Public: the provider sends the browser back here. A session is made for the identity it vouches for, then a
    page of this site moves on (a same-site navigation, so the SameSite=Strict session cookie goes with it)."""
    sso = _plane(request).sso
    if sso is None:
        return _login(request, "/", "Single sign-on is not configured on this server.", 404)
    try:
        if error:
            raise errors.Unauthenticated(
                f"the provider said: {error}" + (f" ({error_description})" if error_description else "")
            )
        if iss is not None and iss.rstrip("/") != sso.settings.issuer:  # RFC 9207: no mix-up with another provider
            raise errors.Unauthenticated("the answer came from another provider than this server's")
        signed = sso.finish_login(state, code, request.cookies.get(SSO_BINDING_COOKIE))
    except errors.RaypodError as exc:
        response = _login(request, "/", f"Single sign-on failed: {exc.message}", exc.http_status)
        response.delete_cookie(SSO_BINDING_COOKIE, path="/login/sso")
        return response
    audit.remember(request.state, signed.principal)
    session, _csrf = _plane(request).identities.create_session(signed.principal)
    response = _render(request, signed.principal, "signed_in.html", next_url=signed.next_url)
    auth.set_session_cookie(request, response, session)
    response.delete_cookie(SSO_BINDING_COOKIE, path="/login/sso")
    return response


@router.get("/")
def clusters_page(request: Request, namespace: FilterQuery = None) -> Response:
    principal = _viewer(request)
    namespace = _name_filter(namespace)
    now = store.now()
    rows = [views.ClusterRow.of(view, now) for view in _plane(request).clusters.list(principal, namespace)]
    return _render(
        request,
        principal,
        "clusters.html",
        ("clusters",),
        rows=rows,
        namespace=namespace or "",
        namespaces=_namespaces(request, principal),
    )


@router.get("/new")
def new_cluster_page(request: Request) -> Response:
    principal = _viewer(request)
    return _render(
        request,
        principal,
        "new_cluster.html",
        namespaces=_namespaces(request, principal),
        ray_version=spec_mod.DEFAULT_RAY_VERSION,
        priorities=sorted(
            _plane(request).governance.priority_classes,
            key=_plane(request).governance.priority_classes.__getitem__,
            reverse=True,
        ),
    )


@router.get("/namespaces/{namespace}/clusters/{name}")
def cluster_page(request: Request, namespace: NamePath, name: NamePath) -> Response:
    principal = _viewer(request)
    try:
        view = _plane(request).clusters.get(principal, namespace, name)
    except errors.NotFound:
        if request.query_params.get("regions"):
            raise  # an open page of a cluster just deleted says so
        return _deleted_cluster_page(request, principal, namespace, name)
    events = _plane(request).clusters.events(principal, namespace, name, EVENTS_SHOWN)
    cluster_jobs = _plane(request).jobs.list(principal, namespace, name)
    deployments = _plane(request).serving.list(principal, namespace, name)
    spaces = [space for space in _plane(request).spaces.list(principal, namespace) if space.cluster == name]
    return _render(
        request,
        principal,
        "cluster.html",
        ("summary", "nodes", "events", "jobs", "deployments", "spaces"),
        view=view,
        spaces=spaces,
        deployments=deployments,
        models=[entry.id for entry in _plane(request).serving.models.list()],
        nodes=views.node_rows(view),
        events=list(reversed(events)),
        jobs=list(reversed(cluster_jobs)),
        snippets=views.snippets(view),
        manifest=yaml.safe_dump(_plane(request).manifest(view), sort_keys=False),
        phase="Deleting" if view.deleting else view.status.phase.value,
        now=store.now(),
        age=views.age,
    )


def _deleted_cluster_page(request: Request, principal: identity.Principal, namespace: str, name: str) -> Response:
    """A deleted cluster's page, read-only, from history (or the error page: no cluster and none kept)."""
    try:
        record = _plane(request).jobs.deleted_cluster(principal, namespace, name)
    except errors.NotFound:
        raise errors.NotFound(f"cluster '{name}' not found in namespace '{namespace}'") from None
    return _render(
        request,
        principal,
        "deleted_cluster.html",
        record=record,
        view=record.cluster,
        nodes=views.node_rows(record.cluster),
        events=list(reversed(record.events[-EVENTS_SHOWN:])),
        jobs=list(reversed(record.jobs)),
        now=store.now(),
        age=views.age,
    )


@router.get("/namespaces/{namespace}/clusters/{name}/jobs/new")
def new_job_page(request: Request, namespace: NamePath, name: NamePath) -> Response:
    principal = _viewer(request)
    view = _plane(request).clusters.get(principal, namespace, name)
    return _render(
        request,
        principal,
        "new_job.html",
        view=view,
        default_runtime_env=views.pretty_json(view.spec.runtime_env),
    )


@router.get("/jobs/{job_id}")
def job_page(
    request: Request, job_id: JobIdPath, attempt: Annotated[int | None, Query(ge=1, le=100)] = None
) -> Response:
    principal = _viewer(request)
    job = _plane(request).jobs.get(principal, job_id)
    shown = attempt if attempt is not None and attempt <= len(job.attempts) else len(job.attempts)
    runs, hung = _plane(request).hangs.of_job(principal, job)
    return _render(
        request,
        principal,
        "job.html",
        ("job_status",),
        job=job,
        runs=runs,
        hangs=hung,
        shown=shown,
        submission=job.attempts[shown - 1].submission_id if shown else "",
        terminal=job.status in state.FINISHED_JOB_STATUSES,
        runtime_env=views.pretty_json(job.spec.runtime_env),
        now=store.now(),
        age=views.age,
    )


@router.get("/quotas")
def quotas_page(request: Request) -> Response:
    """Teams' quotas with what their clusters hold, and the queue in the order it will be admitted; team admins
    set their teams' quotas here."""
    principal = _viewer(request)
    ids: identity.IdentityService = request.app.state.identities
    svc = _plane(request).governance
    teams = [t for t in ids.list_teams() if principal.is_admin or principal.teams.get(t) is state.Role.ADMIN]
    return _render(
        request,
        principal,
        "quotas.html",
        ("quotas", "queue"),
        quotas=[views.QuotaRow.of(view) for view in svc.list_quotas(principal)],
        resources=views.QUOTA_RESOURCES,
        entries=svc.queue(principal),
        admin_teams=teams,
        admin_namespaces=[ns for ns in ids.list_namespaces() if ns.team in teams],
        priorities=sorted(svc.priority_classes, key=svc.priority_classes.__getitem__, reverse=True),
        now=store.now(),
        age=views.age,
    )


@router.get("/audit")
def audit_page(
    request: Request,
    user: Annotated[str, Query(max_length=63)] = "",
    cluster: Annotated[str, Query(max_length=127)] = "",
) -> Response:
    """Installation admins: the newest changes anyone asked for, and whether the log's chain holds."""
    principal = _viewer(request)
    log = _plane(request).audit
    entries = log.list(principal, user=user or None, cluster=cluster or None, limit=500)
    return _render(
        request,
        principal,
        "audit.html",
        entries=list(reversed(entries)),
        verification=log.verify(principal),
        filters={"user": user, "cluster": cluster},
    )


@router.get("/events")
def events_page(
    request: Request,
    namespace: FilterQuery = None,
    cluster: FilterQuery = None,
    kind: Annotated[str | None, Query(alias="type", max_length=16)] = None,
    text: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    principal = _viewer(request)
    namespace, cluster = _name_filter(namespace), _name_filter(cluster)
    chosen_kind = state.EventType(kind) if kind in {t.value for t in state.EventType} else None
    where = store.EventFilter(
        namespaces=frozenset({namespace}) if namespace else None,
        cluster=cluster or None,
        type=chosen_kind,
        text=text or None,
    )
    found = _plane(request).clusters.search_events(principal, where, limit=200)
    return _render(
        request,
        principal,
        "events.html",
        ("event_list",),
        events=list(reversed(found)),
        namespaces=_namespaces(request, principal),
        filters={"namespace": namespace or "", "cluster": cluster or "", "type": kind or "", "text": text or ""},
        event_types=[t.value for t in state.EventType],
        show_cluster=True,
    )


class ManifestText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    yaml: str = Field(max_length=1_000_000)


@router.post("/ui/manifest")
def form_to_manifest(caller: auth.Caller, spec: spec_mod.ClusterSpec) -> ManifestText:
    """The RayCluster a create form describes, as YAML (the form's YAML tab)."""
    del caller
    return ManifestText(yaml=yaml.safe_dump(manifests.raycluster(spec), sort_keys=False))


@router.post("/ui/spec")
def manifest_to_form(caller: auth.Caller, body: ManifestText) -> dict[str, Any]:
    """The ClusterSpec an edited RayCluster describes (back from the YAML tab to the form).

    Raises:
        InvalidSpec: not YAML, not a RayCluster, or a field raypod does not manage.
    """
    del caller
    try:
        document = yaml.safe_load(body.yaml)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise errors.InvalidSpec(f"the manifest is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    return manifests.spec_from_raycluster(document).model_dump(mode="json")
