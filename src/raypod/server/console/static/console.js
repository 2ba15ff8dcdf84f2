// raypod console: live regions, forms that call the public API, and the job log stream.
// No framework and no build step: every page works from this one file, served by raypod itself.
"use strict";

const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content || "";

function toLogin() {
  const next = location.pathname + location.search;
  location.assign("/login?next=" + encodeURIComponent(next));
}

// Calls the raypod API with the session cookie and the CSRF header; returns {ok, status, data}.
async function api(method, url, body) {
  const init = { method, credentials: "same-origin", headers: { "X-CSRF-Token": csrf() } };
  if (body instanceof FormData) {
    init.body = body;
  } else if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (error) {
    return { ok: false, status: 0, data: { message: "the raypod server is not answering (" + error.message + ")" } };
  }
  if (response.status === 401 && !url.startsWith("/login")) {
    toLogin();
  }
  let data = null;
  const text = await response.text();
  try {
    data = text ? JSON.parse(text) : null;
  } catch (_) {
    data = { message: text.slice(0, 300) };
  }
  return { ok: response.ok, status: response.status, data };
}

// -- inline errors --------------------------------------------------------------------------------------

function clearErrors(form) {
  form.querySelectorAll(".field-error").forEach((el) => el.remove());
  form.querySelectorAll("[aria-invalid]").forEach((el) => el.removeAttribute("aria-invalid"));
  const box = form.querySelector("#form-error");
  if (box) {
    box.hidden = true;
    box.textContent = "";
  }
}

function showErrors(form, data) {
  const box = form.querySelector("#form-error");
  const message = (data && data.message) || "the request failed";
  if (box) {
    box.textContent = message;
    box.hidden = false;
  }
  const problems = (data && Array.isArray(data.detail) && data.detail) || [];
  let first = null;
  for (const problem of problems) {
    const field = findField(form, problem.field || "");
    if (!field) continue;
    const input = field.querySelector("input, select, textarea");
    if (input) {
      input.setAttribute("aria-invalid", "true");
      first = first || input;
    }
    const note = document.createElement("small");
    note.className = "field-error";
    note.textContent = problem.problem;
    field.appendChild(note);
  }
  (first || box)?.focus?.();
}

function findField(form, path) {
  // "worker_groups.0.replicas" or "head.memory"; fall back to the closest enclosing field.
  const parts = path.split(".");
  while (parts.length) {
    const field = form.querySelector(`[data-field="${CSS.escape(parts.join("."))}"]`);
    if (field && !field.closest("[hidden]")) return field;
    parts.pop();
  }
  return null;
}

// -- live regions ---------------------------------------------------------------------------------------

function startRegions() {
  const regions = [...document.querySelectorAll("[data-region][data-refresh]")];
  if (!regions.length) return;
  const interval = Math.min(...regions.map((el) => Number(el.dataset.refresh) || 2000));
  let stopped = false;
  const last = new Map(regions.map((el) => [el.dataset.region, el.innerHTML]));
  async function tick() {
    if (stopped || document.hidden) return;
    const url = new URL(location.href);
    url.searchParams.set("regions", "1");
    let response;
    try {
      response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch (_) {
      return; // the server restarts or the network blips: try again next tick
    }
    if (response.status === 401) return toLogin();
    if (response.status === 404 && document.body.dataset.page === "cluster") {
      stopped = true;
      const gone = document.getElementById("cluster-gone");
      if (gone) gone.hidden = false;
      document.querySelectorAll("[data-region] .badge[data-testid=phase]").forEach((el) => (el.textContent = "Deleted"));
      return;
    }
    if (!response.ok) return;
    const rendered = await response.json();
    for (const el of regions) {
      const html = rendered[el.dataset.region];
      if (html !== undefined && html !== last.get(el.dataset.region)) {
        el.innerHTML = html;
        last.set(el.dataset.region, html);
        el.dispatchEvent(new CustomEvent("region-updated", { bubbles: true }));
      }
    }
  }
  setInterval(tick, interval);
  document.addEventListener("visibilitychange", tick);
}

// -- login / logout -------------------------------------------------------------------------------------

function initLogin() {
  const form = document.getElementById("login-form");
  if (!form) return;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const error = document.getElementById("login-error");
    const token = form.token.value.trim();
    if (!token) {
      error.textContent = "Enter an API token.";
      error.hidden = false;
      form.token.setAttribute("aria-invalid", "true");
      form.token.focus();
      return;
    }
    const body = new URLSearchParams({ token });
    const response = await fetch("/login", { method: "POST", body, credentials: "same-origin" });
    if (response.ok) {
      location.assign(form.dataset.next || "/");
      return;
    }
    const data = await response.json().catch(() => ({}));
    error.textContent =
      response.status === 401
        ? "Login failed: " + (data.message || "that token is not valid") + "."
        : "Login failed: " + (data.message || response.statusText);
    error.hidden = false;
    form.token.setAttribute("aria-invalid", "true");
    form.token.select();
  });
}

function initLogout() {
  document.querySelectorAll('[data-action="logout"]').forEach((button) =>
    button.addEventListener("click", async () => {
      const answer = await api("POST", "/logout");
      // A single sign-on session ends at the provider too, which sends the browser back to /login.
      location.assign((answer.data && answer.data.provider_logout) || "/login");
    })
  );
}

// -- new cluster: form <-> spec <-> RayCluster YAML -----------------------------------------------------------

const NUMBER_KEYS = new Set(["cpus", "gpus", "replicas"]);

function initNewCluster() {
  const form = document.getElementById("cluster-form");
  if (!form) return;
  const groups = document.getElementById("worker-groups");
  const template = document.getElementById("group-template");
  let extra = {}; // spec fields the form does not show (labels, image, bounds...): kept, never dropped
  let tab = "form";

  function renumber() {
    [...groups.children].forEach((fieldset, index) => {
      fieldset.querySelector("legend").textContent = `Worker group ${index + 1}`;
      fieldset.querySelectorAll("[data-field]").forEach((field) => {
        field.dataset.field = field.dataset.field.replace(/^worker_groups\.(N|\d+)\./, `worker_groups.${index}.`);
        const input = field.querySelector("input");
        const label = field.querySelector("label");
        input.id = `g${index}-${input.dataset.key}`;
        label.htmlFor = input.id;
      });
    });
  }

  function addGroup(values) {
    const fieldset = template.content.firstElementChild.cloneNode(true);
    for (const input of fieldset.querySelectorAll("input[data-key]")) {
      const value = values && values[input.dataset.key];
      if (value !== undefined && value !== null) input.value = value;
    }
    if (!values && groups.children.length) {
      fieldset.querySelector('[data-key="name"]').value = `workers-${groups.children.length + 1}`;
    }
    groups.appendChild(fieldset);
    renumber();
    return fieldset;
  }

  groups.addEventListener("click", (event) => {
    if (event.target.matches('[data-action="remove-group"]')) {
      event.target.closest("fieldset").remove();
      renumber();
    }
  });
  form.querySelector('[data-action="add-group"]').addEventListener("click", () => {
    addGroup().querySelector("input").focus();
  });
  addGroup();

  function number(value) {
    return value === "" ? value : Number(value);
  }

  // Returns [spec, null] or [null, {message, detail}] for what the browser can already tell.
  function formToSpec() {
    const problems = [];
    const env = {};
    form.env.value.split("\n").forEach((line, index) => {
      if (!line.trim()) return;
      const at = line.indexOf("=");
      if (at < 1) problems.push({ field: "env", problem: `line ${index + 1}: expected KEY=value` });
      else env[line.slice(0, at).trim()] = line.slice(at + 1);
    });
    let runtimeEnv = {};
    if (form.runtime_env.value.trim()) {
      try {
        runtimeEnv = JSON.parse(form.runtime_env.value);
      } catch (error) {
        problems.push({ field: "runtime_env", problem: "not valid JSON: " + error.message });
      }
    }
    if (problems.length) return [null, { message: problems.map((p) => `${p.field}: ${p.problem}`).join("; "), detail: problems }];
    const head = { ...(extra.head || {}) };
    for (const key of ["cpus", "memory", "object_store_memory", "gpus"]) {
      head[key] = NUMBER_KEYS.has(key) ? number(form[`head.${key}`].value) : form[`head.${key}`].value.trim();
    }
    const workerGroups = [...groups.children].map((fieldset, index) => {
      const group = { ...((extra.worker_groups || [])[index] || {}) };
      for (const input of fieldset.querySelectorAll("input[data-key]")) {
        group[input.dataset.key] = NUMBER_KEYS.has(input.dataset.key) ? number(input.value) : input.value.trim();
      }
      return group;
    });
    const timeout = form["hangwatch.timeout"].value.trim();
    const hangwatch = {
      ...(extra.hangwatch || {}),
      enabled: form["hangwatch.enabled"].checked,
      timeout: timeout === "" || timeout === "adaptive" ? null : timeout,
      action: form["hangwatch.action"].value,
    };
    const spec = {
      ...extra,
      hangwatch,
      name: form.name.value.trim(),
      namespace: form.namespace.value,
      priority: form.priority.value,
      ray_version: form.ray_version.value.trim(),
      head,
      worker_groups: workerGroups,
      env,
      runtime_env: runtimeEnv,
    };
    return [spec, null];
  }

  function specToForm(spec) {
    const { name, namespace, ray_version, head, worker_groups, env, runtime_env, ...rest } = spec;
    extra = { ...rest, head: { ...head }, worker_groups: (worker_groups || []).map((g) => ({ ...g })) };
    form.name.value = name || "";
    if (![...form.namespace.options].some((o) => o.value === namespace)) {
      form.namespace.add(new Option(namespace, namespace));
    }
    form.namespace.value = namespace;
    form.ray_version.value = ray_version || "";
    if (rest.priority && [...form.priority.options].some((o) => o.value === rest.priority)) form.priority.value = rest.priority;
    for (const key of ["cpus", "memory", "object_store_memory", "gpus"]) form[`head.${key}`].value = head[key];
    groups.replaceChildren();
    for (const group of worker_groups || []) addGroup(group);
    form.env.value = Object.entries(env || {}).map(([k, v]) => `${k}=${v}`).join("\n");
    form.runtime_env.value = runtime_env && Object.keys(runtime_env).length ? JSON.stringify(runtime_env, null, 2) : "";
    const hangwatch = spec.hangwatch || {};
    form["hangwatch.enabled"].checked = hangwatch.enabled !== false;
    form["hangwatch.timeout"].value = hangwatch.timeout == null ? "adaptive" : `${hangwatch.timeout}s`;
    form["hangwatch.action"].value = hangwatch.action || "notify";
  }

  async function yamlToSpec() {
    const result = await api("POST", "/ui/spec", { yaml: form.yaml.value });
    if (!result.ok) {
      const data = result.data || {};
      return [null, { message: "The manifest was not accepted: " + (data.message || result.status), detail: [{ field: "manifest", problem: data.message || "" }] }];
    }
    return [result.data, null];
  }

  const tabs = { form: document.getElementById("tab-form"), yaml: document.getElementById("tab-yaml") };
  const panels = { form: document.getElementById("panel-form"), yaml: document.getElementById("panel-yaml") };

  function show(name) {
    tab = name;
    for (const key of Object.keys(tabs)) {
      const selected = key === name;
      tabs[key].setAttribute("aria-selected", String(selected));
      tabs[key].tabIndex = selected ? 0 : -1;
      panels[key].hidden = !selected;
    }
  }

  async function switchTo(name) {
    if (name === tab) return;
    clearErrors(form);
    if (name === "yaml") {
      const [spec, problem] = formToSpec();
      if (problem) return showErrors(form, problem);
      const result = await api("POST", "/ui/manifest", spec);
      if (!result.ok) return showErrors(form, result.data);
      form.yaml.value = result.data.yaml;
    } else {
      const [spec, problem] = await yamlToSpec();
      if (problem) return showErrors(form, problem);
      specToForm(spec);
    }
    show(name);
    tabs[name].focus();
  }

  for (const [name, button] of Object.entries(tabs)) {
    button.addEventListener("click", () => switchTo(name));
    button.addEventListener("keydown", (event) => {
      if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
        event.preventDefault();
        switchTo(name === "form" ? "yaml" : "form");
      }
    });
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const [spec, problem] = tab === "form" ? formToSpec() : await yamlToSpec();
    if (problem) return showErrors(form, problem);
    const button = form.querySelector('button[type="submit"]');
    button.disabled = true;
    const result = await api("POST", "/api/v1/clusters", spec);
    button.disabled = false;
    if (!result.ok) return showErrors(form, result.data);
    location.assign(`/namespaces/${result.data.spec.namespace}/clusters/${result.data.spec.name}`);
  });
}

// -- cluster page -----------------------------------------------------------------------------------------

function clusterPath() {
  const heading = document.querySelector(".heading[data-cluster]");
  const [namespace, name] = heading.dataset.cluster.split("/");
  return `/api/v1/namespaces/${namespace}/clusters/${name}`;
}

function initCluster() {
  if (document.body.dataset.page !== "cluster") return;
  const message = document.getElementById("scale-message");
  document.querySelectorAll("form.scale").forEach((form) =>
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const input = form.querySelector("input");
      const replicas = Number(input.value);
      const result = await api("POST", clusterPath() + "/scale", { group: form.dataset.group, replicas });
      if (result.ok) {
        input.removeAttribute("aria-invalid");
        message.className = "muted";
        message.textContent = `Scaling group ${form.dataset.group} to ${replicas} workers.`;
      } else {
        input.setAttribute("aria-invalid", "true");
        message.className = "error";
        message.textContent = "Scale refused: " + ((result.data && result.data.message) || result.status);
      }
    })
  );

  const dialog = document.getElementById("delete-dialog");
  const confirmInput = document.getElementById("delete-confirm");
  const confirmButton = dialog.querySelector('[data-action="confirm-delete"]');
  document.querySelector('[data-action="open-delete"]').addEventListener("click", () => {
    confirmInput.value = "";
    confirmButton.disabled = true;
    dialog.showModal();
    confirmInput.focus();
  });
  dialog.querySelector('[data-action="close-dialog"]').addEventListener("click", () => dialog.close());
  confirmInput.addEventListener("input", () => {
    confirmButton.disabled = confirmInput.value !== confirmInput.dataset.expect;
  });
  document.getElementById("delete-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (confirmInput.value !== confirmInput.dataset.expect) return;
    const result = await api("DELETE", clusterPath());
    if (!result.ok) {
      const error = document.getElementById("delete-error");
      error.textContent = "Delete refused: " + ((result.data && result.data.message) || result.status);
      error.hidden = false;
      return;
    }
    dialog.close();
    document.querySelectorAll('[data-action="open-delete"]').forEach((b) => (b.disabled = true));
  });
}

function initDeployments() {
  if (document.body.dataset.page !== "cluster") return;
  const message = document.getElementById("deployment-message");
  const form = document.getElementById("deploy-form");
  form?.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const spec = {
      model: form.model.value,
      replicas: Number(form.replicas.value),
      cpus: Number(form.cpus.value),
      kv_cache: form.kv_cache.checked,
    };
    if (form.name.value.trim()) spec.name = form.name.value.trim();
    const button = form.querySelector('button[type="submit"]');
    button.disabled = true;
    try {
      const result = await api("POST", clusterPath() + "/deployments", spec);
      if (!result.ok) return showErrors(form, result.data);
      message.className = "muted";
      message.textContent = `Deploying ${result.data.model} as ${result.data.name}.`;
    } finally {
      button.disabled = false;
    }
  });
  // Rows are re-rendered by the live region: listen on the section, not on each button.
  document.querySelector('[data-region="deployments"]').addEventListener("click", async (event) => {
    const button = event.target.closest('[data-action="delete-deployment"]');
    if (!button) return;
    button.disabled = true;
    const name = button.dataset.name;
    const result = await api("DELETE", `${clusterPath()}/deployments/${encodeURIComponent(name)}`);
    message.className = result.ok ? "muted" : "error";
    message.textContent = result.ok
      ? `Deleting ${name}.`
      : "Delete refused: " + ((result.data && result.data.message) || result.status);
    if (!result.ok) button.disabled = false;
  });
}

function initQuotas() {
  const form = document.getElementById("quota-form");
  if (!form) return;
  const saved = document.getElementById("quota-saved");
  const LIMITS = ["cpus", "memory", "gpus", "clusters", "nodes"];

  // The chosen team's (or namespace's) current quota fills the form, so a change edits it rather than starting
  // from nothing; a namespace picks its team, and borrowing is a team's alone.
  function fill() {
    const picked = form.namespace.selectedOptions[0];
    if (picked && picked.dataset.team) form.team.value = picked.dataset.team;
    const key = form.namespace.value ? `ns-${form.namespace.value}` : form.team.value;
    const row = document.querySelector(`[data-testid="quota-${CSS.escape(key)}"]`);
    const quota = row ? JSON.parse(row.dataset.quota) : {};
    for (const limit of LIMITS) form[limit].value = quota[limit] == null ? "" : quota[limit];
    form.policy.value = quota.policy || "queue";
    form.borrow.checked = Boolean(quota.borrow);
    form.borrow.disabled = Boolean(form.namespace.value);
  }
  form.team.addEventListener("change", () => {
    form.namespace.value = "";
    fill();
  });
  form.namespace.addEventListener("change", fill);
  fill();

  function path() {
    if (form.namespace.value) return `/api/v1/namespaces/${encodeURIComponent(form.namespace.value)}/quota`;
    return `/api/v1/teams/${encodeURIComponent(form.team.value)}/quota`;
  }
  const owner = () => (form.namespace.value ? `namespace ${form.namespace.value}` : `team ${form.team.value}`);

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    saved.textContent = "";
    const quota = { policy: form.policy.value, borrow: form.borrow.checked && !form.namespace.value };
    for (const key of LIMITS) {
      const value = form[key].value.trim();
      if (value !== "") quota[key] = key === "memory" ? value : Number(value);
    }
    const result = await api("PUT", path(), quota);
    if (!result.ok) return showErrors(form, result.data);
    saved.textContent = `Quota of ${owner()} set. Nothing running is stopped; new work waits if it does not fit.`;
  });
  form.querySelector('[data-action="delete-quota"]').addEventListener("click", async () => {
    clearErrors(form);
    const result = await api("DELETE", path());
    if (!result.ok) return showErrors(form, result.data);
    saved.textContent = form.namespace.value
      ? `Namespace ${form.namespace.value} has no quota of its own now: its team's applies.`
      : `Team ${form.team.value} has no quota now: the pool is its only limit.`;
  });
}

function initSpaces() {
  if (document.body.dataset.page !== "cluster") return;
  const message = document.getElementById("space-message");
  const namespace = clusterPath().split("/")[4];
  const cluster = clusterPath().split("/")[6];
  const say = (ok, text) => {
    message.className = ok ? "muted" : "error";
    message.textContent = text;
  };
  const form = document.getElementById("space-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { name: form.name.value.trim(), kind: form.kind.value, cluster };
    if (form.python_env.value.trim()) body.python_env = form.python_env.value.trim();
    const result = await api("POST", `/api/v1/namespaces/${namespace}/spaces`, body);
    if (!result.ok) {
      form.name.setAttribute("aria-invalid", "true");
      return say(false, "Workspace refused: " + ((result.data && result.data.message) || result.status));
    }
    form.name.removeAttribute("aria-invalid");
    say(true, `Starting workspace ${result.data.name}: it opens once its IDE answers.`);
  });
  document.querySelector('[data-region="spaces"]').addEventListener("click", async (event) => {
    const button = event.target.closest('[data-action="space"]');
    if (!button) return;
    const { verb, name } = button.dataset;
    if (verb === "delete" && !confirm(`Delete workspace ${name}? Its files are kept.`)) return;
    button.disabled = true;
    const base = `/api/v1/namespaces/${namespace}/spaces/${encodeURIComponent(name)}`;
    const result = verb === "delete" ? await api("DELETE", base) : await api("POST", `${base}/${verb}`);
    say(result.ok, result.ok ? `Workspace ${name}: ${verb} requested.` : `Refused: ${(result.data && result.data.message) || result.status}`);
    if (!result.ok) button.disabled = false;
  });
}

function initCopy() {
  document.querySelectorAll("[data-copy]").forEach((button) =>
    button.addEventListener("click", async () => {
      const text = document.getElementById(button.dataset.copy).innerText;
      try {
        await navigator.clipboard.writeText(text);
        button.textContent = "Copied";
      } catch (_) {
        const range = document.createRange();
        range.selectNodeContents(document.getElementById(button.dataset.copy));
        getSelection().removeAllRanges();
        getSelection().addRange(range);
        button.textContent = "Selected: press Ctrl+C";
      }
      setTimeout(() => (button.textContent = "Copy"), 2000);
    })
  );
}

function initAutosubmit() {
  document.querySelectorAll("select[data-autosubmit]").forEach((select) =>
    select.addEventListener("change", () => select.form.submit())
  );
}

// -- jobs -------------------------------------------------------------------------------------------------

function initNewJob() {
  const form = document.getElementById("job-form");
  if (!form) return;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const base = `/api/v1/namespaces/${form.dataset.namespace}/clusters/${form.dataset.cluster}`;
    let runtimeEnv = {};
    if (form.runtime_env.value.trim()) {
      try {
        runtimeEnv = JSON.parse(form.runtime_env.value);
      } catch (error) {
        return showErrors(form, { message: "runtime_env is not valid JSON", detail: [{ field: "runtime_env", problem: error.message }] });
      }
    }
    const button = form.querySelector('button[type="submit"]');
    button.disabled = true;
    try {
      const files = form.working_dir.files;
      if (files && files.length) {
        const upload = new FormData();
        for (const file of files) upload.append("files", file, file.webkitRelativePath || file.name);
        const uploaded = await api("POST", `${base}/working-dirs`, upload);
        if (!uploaded.ok) {
          return showErrors(form, { ...uploaded.data, detail: [{ field: "working_dir", problem: (uploaded.data || {}).message || "upload failed" }] });
        }
        runtimeEnv = { ...runtimeEnv, working_dir: uploaded.data.uri };
      }
      const spec = {
        entrypoint: form.entrypoint.value.trim(),
        runtime_env: runtimeEnv,
        max_retries: Number(form.max_retries.value || 0),
        backoff_s: Number(form.backoff_s.value || 0),
      };
      const result = await api("POST", `${base}/jobs`, spec);
      if (!result.ok) return showErrors(form, result.data);
      location.assign(`/jobs/${result.data.id}`);
    } finally {
      button.disabled = false;
    }
  });
}

function initJob() {
  const log = document.getElementById("job-log");
  if (!log) return;
  const state = document.getElementById("log-state");
  const message = document.getElementById("job-message");
  let socket = null;
  let finished = false;

  function terminal() {
    return document.querySelector("[data-terminal]")?.dataset.terminal === "true";
  }

  function connect() {
    const submission = log.dataset.submission;
    if (!submission) {
      state.textContent = "Waiting for the first attempt to start…";
      return setTimeout(() => location.reload(), 2000);
    }
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const url = `${scheme}://${location.host}/clusters/${log.dataset.namespace}/${log.dataset.cluster}/api/jobs/${submission}/logs/tail`;
    log.textContent = ""; // Ray's tail starts from the first line on every connection
    socket = new WebSocket(url);
    state.textContent = "Streaming logs…";
    socket.onmessage = (event) => {
      const follow = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.append(event.data);
      if (follow) log.scrollTop = log.scrollHeight;
    };
    socket.onclose = (event) => {
      if (finished) return;
      if (event.code === 4401) return toLogin();
      if (terminal() || event.code === 1000) {
        finished = true;
        state.textContent = "End of log.";
        return;
      }
      state.textContent = "Log stream interrupted; reconnecting…";
      setTimeout(connect, 1500);
    };
  }
  connect();

  document.addEventListener("region-updated", () => {
    const attempts = Number(document.querySelector("[data-attempts]")?.dataset.attempts || 0);
    const stop = document.querySelector('[data-action="stop-job"]');
    if (stop) stop.disabled = terminal();
    if (!new URL(location.href).searchParams.get("attempt") && attempts > Number(log.dataset.attempt || 0)) {
      location.reload(); // a retry started: follow the newest attempt
    }
  });

  document.querySelector('[data-action="stop-job"]')?.addEventListener("click", async (event) => {
    const result = await api("POST", `/api/v1/jobs/${event.target.dataset.job}/stop`);
    message.className = result.ok ? "muted" : "error";
    message.textContent = result.ok ? "Stop requested." : "Stop refused: " + ((result.data && result.data.message) || result.status);
  });
}

// -- charts -----------------------------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#1f5fd1", "#d1521f", "#1b7f3b", "#8a3fd1", "#a15c00", "#00838f", "#c2185b", "#5d6d7e"];

function formatValue(value, unit) {
  if (unit === "percent") return value.toFixed(0) + "%";
  if (unit === "bytes") {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let index = 0;
    while (value >= 1024 && index < units.length - 1) {
      value /= 1024;
      index += 1;
    }
    return value.toFixed(value < 10 && index ? 1 : 0) + " " + units[index];
  }
  return Number.isInteger(value) ? String(value) : value.toFixed(2);
}

function svgElement(name, attributes) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  return element;
}

function drawChart(chart, windowStart, windowEnd) {
  const figure = document.createElement("figure");
  figure.className = "chart";
  figure.dataset.chart = chart.key;
  const caption = document.createElement("figcaption");
  caption.textContent = chart.title;
  figure.appendChild(caption);
  const width = 420, height = 150, left = 62, bottom = 8, pad = 8;
  const points = chart.series.flatMap((s) => s.points.map((p) => p[1]));
  const floor = { percent: 100, bytes: 64 * 2 ** 20 }[chart.unit] || 1;
  const top = Math.max(floor, ...points.map((v) => v * 1.1));
  const svg = svgElement("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" });
  const summary = chart.series.map((s) => `${s.name} ${formatValue(s.points.at(-1)?.[1] ?? 0, chart.unit)}`).join(", ");
  svg.setAttribute("aria-label", `${chart.title}: ${summary || "no data yet"}`);
  for (const fraction of [0, 0.5, 1]) {
    const y = pad + (height - bottom - pad) * (1 - fraction);
    svg.appendChild(svgElement("line", { x1: left, x2: width, y1: y, y2: y, class: "grid" }));
    const label = svgElement("text", { x: left - 6, y: y + 4, "text-anchor": "end", class: "axis" });
    label.textContent = formatValue(top * fraction, chart.unit);
    svg.appendChild(label);
  }
  const span = Math.max(1, windowEnd - windowStart);
  chart.series.forEach((series, index) => {
    const coordinates = series.points.map(([t, v]) => {
      const x = left + ((t - windowStart) / span) * (width - left);
      const y = pad + (height - bottom - pad) * (1 - v / top);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    if (coordinates.length) {
      svg.appendChild(svgElement("polyline", { points: coordinates.join(" "), stroke: COLORS[index % COLORS.length], class: "series", "data-series": series.name }));
    }
  });
  figure.appendChild(svg);
  const legend = document.createElement("ul");
  legend.className = "legend";
  chart.series.forEach((series, index) => {
    const item = document.createElement("li");
    const swatch = svgElement("svg", { viewBox: "0 0 10 10", width: 10, height: 10, "aria-hidden": "true" });
    swatch.appendChild(svgElement("rect", { width: 10, height: 10, fill: COLORS[index % COLORS.length] }));
    item.appendChild(swatch);
    item.append(` ${series.name}: ${formatValue(series.points.at(-1)?.[1] ?? 0, chart.unit)}`);
    legend.appendChild(item);
  });
  if (!chart.series.length) legend.innerHTML = "<li>no data yet</li>";
  figure.appendChild(legend);
  return figure;
}

function initCharts() {
  const box = document.getElementById("charts");
  if (!box) return;
  async function load() {
    if (document.hidden) return;
    const result = await api("GET", box.dataset.src);
    if (!result.ok) {
      const message = document.createElement("p");
      message.className = result.status === 409 ? "muted" : "error";
      message.textContent = result.status === 409
        ? "Monitoring is off. Run 'raypod monitoring up' to chart this cluster."
        : "Charts are unavailable: " + ((result.data && result.data.message) || result.status);
      box.replaceChildren(message);
      return;
    }
    const { charts, end, window_s: windowSize } = result.data;
    box.replaceChildren(...charts.map((chart) => drawChart(chart, end - windowSize, end)));
  }
  load();
  setInterval(load, 15000);
}

document.addEventListener("DOMContentLoaded", () => {
  initLogin();
  initLogout();
  initAutosubmit();
  initNewCluster();
  initCluster();
  initDeployments();
  initSpaces();
  initQuotas();
  initCopy();
  initNewJob();
  initJob();
  initCharts();
  startRegions();
});
