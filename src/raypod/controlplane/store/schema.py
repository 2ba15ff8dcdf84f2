"""The database schema, defined once: every table raypod stores. The Alembic migrations beside it create and
upgrade it; ``tests/controlplane/test_store.py`` checks that the two agree."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

clusters = sa.Table(
    "clusters",
    metadata,
    sa.Column("uid", sa.String(32), primary_key=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("name", sa.String(63), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("generation", sa.Integer, nullable=False, default=1),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("deleting", sa.Boolean, nullable=False, default=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    # Governance: a queued cluster runs no node until admitted (or again, once preempted); the reason says why.
    sa.Column("queued", sa.Boolean, nullable=False, default=False, server_default=sa.false()),
    sa.Column("queue_reason", sa.Text, nullable=False, default="", server_default=""),
    # A preempted cluster's nodes run until then: its work was told, and has that long to save a checkpoint.
    sa.Column("preempted_until", sa.DateTime(timezone=True), nullable=True),
    # A scale-up beyond the quota waits in the queue as this spec; the running spec stays until it is admitted.
    sa.Column("pending_spec", sa.Text, nullable=True),
    sa.Column("pending_reason", sa.Text, nullable=False, default="", server_default=""),
    sa.Column("pending_since", sa.DateTime(timezone=True), nullable=True),
    # Idle suspension: set while the cluster is suspended (no node runs, no quota held) until it is resumed.
    sa.Column("suspended_at", sa.DateTime(timezone=True), nullable=True),
    sa.UniqueConstraint("namespace", "name", name="uq_clusters_namespace_name"),
)

quotas = sa.Table(
    "quotas",
    metadata,
    sa.Column("team", sa.String(63), primary_key=True),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("updated_by", sa.String(63), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

# A namespace's own cap inside its team's quota.
namespace_quotas = sa.Table(
    "namespace_quotas",
    metadata,
    sa.Column("namespace", sa.String(63), primary_key=True),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("updated_by", sa.String(63), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cluster_uid", sa.String(32), nullable=False, index=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("cluster", sa.String(63), nullable=False),
    sa.Column("time", sa.DateTime(timezone=True), nullable=False),
    sa.Column("type", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(64), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("node", sa.String(63), nullable=True),
    sa.Index("ix_events_namespace_cluster", "namespace", "cluster"),
)

users = sa.Table(
    "users",
    metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("is_admin", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
teams = sa.Table(
    "teams",
    metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
memberships = sa.Table(
    "memberships",
    metadata,
    sa.Column("team", sa.String(63), primary_key=True),
    sa.Column("user", sa.String(63), primary_key=True),
    sa.Column("role", sa.String(16), nullable=False),
)
namespaces = sa.Table(
    "namespaces",
    metadata,
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("team", sa.String(63), nullable=False),
)
tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", sa.String(16), primary_key=True),
    sa.Column("user", sa.String(63), nullable=False),
    sa.Column("name", sa.String(63), nullable=False),
    sa.Column("secret_hash", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    # The token it was made with (migration 0011): it expires no later and is revoked with it.
    sa.Column("parent_id", sa.String(16), nullable=True, index=True),
)
sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id_hash", sa.String(64), primary_key=True),
    sa.Column("user", sa.String(63), nullable=False),
    sa.Column("csrf", sa.String(64), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    # The token the session was made from: revoking or expiring it ends the session (migration 0004).
    sa.Column("token_id", sa.String(16), nullable=True),
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("cluster", sa.String(63), nullable=False),
    sa.Column("owner", sa.String(63), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Text, nullable=False),
    sa.Column("stop_requested", sa.Boolean, nullable=False),
    # Why raypod asked the job to fail (a run that hung again and again); the supervisor carries it out (0012).
    sa.Column("fail_requested", sa.Text, nullable=True),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    # "raypod" (raypod job submit, the console) or "ray" (plain Ray tooling, imported from the cluster).
    sa.Column("submitted_via", sa.String(8), nullable=False, server_default="raypod"),
    sa.Index("ix_jobs_cluster", "namespace", "cluster"),
)

node_requests = sa.Table(
    "node_requests",
    metadata,
    sa.Column("cluster_uid", sa.String(32), primary_key=True),
    sa.Column("node", sa.String(63), primary_key=True),
    sa.Column("kind", sa.String(16), primary_key=True),  # "replace", "cordon" or "delete-files"
    # The incarnation a replace request is for, bound on the first pass that sees it: done once it changed.
    sa.Column("incarnation", sa.String(64), nullable=True),
    sa.Column("requested_by", sa.String(63), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("path", sa.Text, nullable=True),  # delete-files: the directory the node was given
)

hang_detections = sa.Table(
    "hang_detections",
    metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("cluster_uid", sa.String(32), nullable=False, index=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("cluster", sa.String(63), nullable=False),
    sa.Column("job", sa.String(32), nullable=True, index=True),
    sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False),
    # The rest of the merged detection (state.HangDetection as JSON: ranks with their stacks and log lines).
    sa.Column("detection", sa.Text, nullable=False),
)

models = sa.Table(
    "models",
    metadata,
    sa.Column("id", sa.String(129), primary_key=True),
    # serving.catalog.ModelEntry as JSON: source, files with sizes and checksums, what a replica needs.
    sa.Column("entry", sa.Text, nullable=False),
    sa.Column("added_by", sa.String(63), nullable=False),
    sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
)

# Catalog entries being added: the serving applier reads and checksums the source, then writes ``models`` and
# deletes the row; a source it could not read keeps its row with ``failure`` until it is asked for again.
model_additions = sa.Table(
    "model_additions",
    metadata,
    sa.Column("id", sa.String(129), primary_key=True),
    sa.Column("source", sa.Text, nullable=False),  # serving.catalog.ModelSource as JSON
    sa.Column("replace", sa.Boolean, nullable=False),
    sa.Column("requested_by", sa.String(63), nullable=False),
    sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("failure", sa.Text, nullable=True),
)

deployments = sa.Table(
    "deployments",
    metadata,
    sa.Column("cluster_uid", sa.String(32), primary_key=True),
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("cluster", sa.String(63), nullable=False),
    sa.Column("model", sa.String(129), nullable=False),
    sa.Column("owner", sa.String(63), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("engine", sa.String(8), nullable=False),
    # Empty until the deployment applier submits it (migration 0013 added the two columns after it).
    sa.Column("deploy_job", sa.String(64), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("failure", sa.Text, nullable=True),  # why the applier could not submit it
    sa.Column("delete_requested", sa.Boolean, nullable=False, server_default=sa.false()),
)

# Append-only: each row's hash covers the previous row's hash and its own fields (controlplane/audit.py).
audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("time", sa.DateTime(timezone=True), nullable=False, index=True),
    sa.Column("actor", sa.String(63), nullable=False, index=True),
    sa.Column("token_id", sa.String(64), nullable=False),
    sa.Column("via", sa.String(16), nullable=False),
    sa.Column("source", sa.String(16), nullable=False),
    sa.Column("action", sa.String(512), nullable=False),
    sa.Column("target", sa.String(200), nullable=False, index=True),
    sa.Column("client", sa.String(64), nullable=False),
    sa.Column("result", sa.Integer, nullable=False),
    sa.Column("hash", sa.String(64), nullable=False),
)

schedules = sa.Table(
    "schedules",
    metadata,
    sa.Column("namespace", sa.String(63), primary_key=True),
    sa.Column("name", sa.String(63), primary_key=True),
    sa.Column("owner", sa.String(63), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),  # spec.ScheduleSpec as JSON
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    # The latest scheduled time a run was made for (runs are jobs whose id derives from it: made once).
    sa.Column("last_scheduled_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_message", sa.Text, nullable=False, server_default=""),
)

# Single sign-on (controlplane/sso.py): the provider identity (issuer, subject) each SSO user is bound to, so another
# identity can never take a user name over; logins under way (state, nonce and PKCE verifier, at most 10 minutes,
# used once); and the raypod tokens SSO minted, with the provider session they came from (a back-channel logout
# revokes them).
sso_accounts = sa.Table(
    "sso_accounts",
    metadata,
    sa.Column("issuer", sa.String(255), primary_key=True),
    sa.Column("subject", sa.String(255), primary_key=True),
    sa.Column("user", sa.String(63), nullable=False, unique=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("last_login_at", sa.DateTime(timezone=True), nullable=False),
)

sso_pending = sa.Table(
    "sso_pending",
    metadata,
    sa.Column("state_hash", sa.String(64), primary_key=True),
    sa.Column("binding_hash", sa.String(64), nullable=False),
    sa.Column("nonce", sa.String(64), nullable=False),
    sa.Column("code_verifier", sa.String(128), nullable=False),
    sa.Column("next_url", sa.String(2048), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

sso_tokens = sa.Table(
    "sso_tokens",
    metadata,
    sa.Column("token_id", sa.String(16), primary_key=True),
    sa.Column("issuer", sa.String(255), nullable=False),
    sa.Column("subject", sa.String(255), nullable=False, index=True),
    sa.Column("sid", sa.String(255), nullable=True, index=True),
)
