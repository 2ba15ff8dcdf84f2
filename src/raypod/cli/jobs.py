"""``raypod job ...``: raypod jobs (Ray jobs with retries). Plain ``ray job ... --address raypod://`` works too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from raypod import errors, state
from raypod import spec as spec_mod
from raypod.cli import clusters as cluster_cli
from raypod.cli import output, schedules
from raypod.cli.output import Format

JobIdArg = Annotated[str, typer.Argument(help="The job: raypod's rj-... id or Ray's raysubmit_... id.")]
app = typer.Typer(help="Submit, list, follow and stop jobs (with retries).", no_args_is_help=True)
OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="table, json or yaml.")]


def _upload_working_dir(cluster: str, namespace: str, runtime_env: dict[str, Any]) -> dict[str, Any]:
    """Upload a local working_dir through the gateway the way `ray job submit` does, returning the runtime_env
    with its gcs:// URI (retries reuse the uploaded package)."""
    from ray.job_submission import JobSubmissionClient

    submission = JobSubmissionClient(f"raypod://{cluster}/{namespace}")
    submission._upload_working_dir_if_needed(runtime_env)
    submission._upload_py_modules_if_needed(runtime_env)
    return runtime_env


@app.command()
def submit(
    entrypoint: Annotated[list[str], typer.Argument(help="The command, after --.")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Cluster to run on.")],
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    working_dir: Annotated[Path | None, typer.Option(help="Directory uploaded as the job's working_dir.")] = None,
    runtime_env_json: Annotated[str | None, typer.Option(help="runtime_env as JSON.")] = None,
    max_retries: Annotated[int, typer.Option(help="Resubmit a FAILED job up to N times (not a stopped one).")] = 0,
    backoff: Annotated[float, typer.Option(help="Seconds before the first retry; doubles each time.")] = 2.0,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Follow until the job ends.")] = True,
    as_rayjob: Annotated[
        bool, typer.Option(help="Kubernetes: a KubeRay RayJob on a cluster of its own shaped as --cluster.")
    ] = False,
    keep_cluster: Annotated[bool, typer.Option(help="With --as-rayjob: keep its cluster after the job.")] = False,
    hang_timeout: Annotated[
        str | None, typer.Option(help="Ray Train hang timeout: seconds, 15m, 1h, or adaptive.")
    ] = None,
    hang_action: Annotated[str | None, typer.Option(help="On a hang: notify, or cancel (restart the run).")] = None,
    hang_rules: Annotated[Path | None, typer.Option(help="YAML/JSON file of hang detection rules.")] = None,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Submit a job: raypod job submit -c demo --max-retries 2 -- python train.py"""
    metadata = _hang_metadata(hang_timeout, hang_action, hang_rules)
    try:
        runtime_env: dict[str, Any] = json.loads(runtime_env_json) if runtime_env_json else {}
    except ValueError as exc:
        raise errors.InvalidSpec(f"--runtime-env-json is not JSON: {exc}") from None
    if working_dir is not None:
        if not working_dir.is_dir():
            raise errors.InvalidSpec(f"--working-dir {working_dir} is not a directory")
        runtime_env["working_dir"] = str(working_dir)
    if as_rayjob and working_dir is not None:
        raise errors.InvalidSpec(
            "--working-dir with --as-rayjob: the RayJob's cluster is a new one that cannot see an upload; "
            "give runtime_env's working_dir as a remote URI (s3://..., https://...)"
        )
    if "working_dir" in runtime_env or "py_modules" in runtime_env:
        runtime_env = _upload_working_dir(cluster, namespace, runtime_env)
    spec = spec_mod.JobSpec(
        entrypoint=" ".join(entrypoint),
        runtime_env=runtime_env,
        max_retries=max_retries,
        backoff_s=backoff,
        metadata=metadata,
        as_rayjob=as_rayjob,
        keep_cluster=keep_cluster,
    )
    api = cluster_cli.client()
    job = api.jobs.submit(cluster, spec, namespace)
    output.errors_console.print(f"job {job.id} submitted to {namespace}/{cluster}")
    if wait:
        job = api.jobs.wait(job.id, timeout=float("inf"), on_progress=output.status_lines(_attempt_line))
        print(api.jobs.logs(job.id), end="")
    _render(job, fmt)
    if wait and job.status is not state.JobStatus.SUCCEEDED:
        raise typer.Exit(1)


def _attempt_line(job: state.JobView) -> str:
    return f"{job.status.value} (attempt {len(job.attempts)} of {job.spec.max_retries + 1})"


@app.command("list")
def list_(
    cluster: Annotated[str | None, typer.Option("--cluster", "-c")] = None,
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    every: Annotated[
        bool, typer.Option("--all", help="Every cluster you may view (-n narrows it), deleted clusters' included.")
    ] = False,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Every job of a cluster: submitted with raypod or with plain Ray tooling (``via``), and by whom (``by``)."""
    api = cluster_cli.client()
    if every:
        found = api.jobs.list_all(namespace if namespace != "default" or cluster else None)
        if cluster:
            found = [job for job in found if job.cluster == cluster]
    elif cluster is None:
        raise errors.InvalidSpec("pass --cluster NAME, or --all for every cluster's jobs")
    else:
        found = api.jobs.list(cluster, namespace)
    if fmt is not Format.TABLE:
        output.emit_data(found, fmt)
        return
    existing = {(v.spec.namespace, v.spec.name) for v in api.clusters.list()} if every else set()
    for job in found:
        # Ray's submission id too: plain Ray users know their job by it, and get|logs|stop take either.
        ray_id = job.attempts[-1].submission_id if job.attempts else "-"
        where = ""
        if every:
            gone = "" if (job.namespace, job.cluster) in existing else " (deleted)"
            where = f"{job.namespace}/{job.cluster}{gone}  "
        output.console.print(
            f"{job.id}  {where}ray={ray_id:<26} {job.status.value:<10} via={job.submitted_via.value:<6} "
            f"by={job.owner or '-':<12} attempts={len(job.attempts)}  {job.spec.entrypoint[:60]}"
        )


@app.command()
def summary(
    job_id: JobIdArg,
    attempt: Annotated[int | None, typer.Option(help="Default: the latest.")] = None,
    fmt: OutputOpt = Format.YAML,
) -> None:
    """An ended attempt's tasks and actors by state and its failed tasks with their errors (kept in history)."""
    output.emit_data(cluster_cli.client().jobs.summary(job_id, attempt), Format.YAML if fmt is Format.TABLE else fmt)


@app.command()
def metrics(
    job_id: JobIdArg,
    attempt: Annotated[int | None, typer.Option(help="Default: the latest.")] = None,
    fmt: OutputOpt = Format.JSON,
) -> None:
    """Its cluster's charts over an ended attempt (CPU, memory, object store, tasks per node), kept in history
    when it ended while raypod's Prometheus ran."""
    output.emit_data(cluster_cli.client().jobs.metrics(job_id, attempt), Format.JSON if fmt is Format.TABLE else fmt)


@app.command()
def get(job_id: JobIdArg, fmt: OutputOpt = Format.TABLE) -> None:
    _render(cluster_cli.client().jobs.get(job_id), fmt)


@app.command()
def logs(
    job_id: JobIdArg, attempt: Annotated[int | None, typer.Option(help="Attempt number (default: last).")] = None
) -> None:
    print(cluster_cli.client().jobs.logs(job_id, attempt), end="")


@app.command()
def stop(job_id: JobIdArg) -> None:
    """Stop a job; it will not be retried."""
    job = cluster_cli.client().jobs.stop(job_id)
    output.console.print(f"job {job.id}: stop requested")


@app.command()
def hangs(
    cluster: Annotated[str, typer.Argument(help="The cluster.")],
    job: Annotated[str | None, typer.Argument(help="Only this job's detections.")] = None,
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "default",
    stacks: Annotated[bool, typer.Option("--stacks/--no-stacks", help="Print every rank's stack.")] = True,
    fmt: OutputOpt = Format.TABLE,
) -> None:
    """Hung or faulted Ray Train runs, with which ranks stalled first, their stacks and last log lines."""
    found = cluster_cli.client().jobs.hangs(cluster, job, namespace)
    if fmt is not Format.TABLE:
        output.emit_data(found, fmt)
        return
    if not found:
        output.console.print(f"no hangs detected on {namespace}/{cluster}" + (f" for job {job}" if job else ""))
    for detection in found:
        output.console.print(
            f"[bold]{detection.detected_at:%Y-%m-%d %H:%M:%S}[/bold] {detection.kind} in run {detection.run} "
            f"(job {detection.job or detection.ray_job_id}), action {detection.action}: {detection.reason}",
            markup=True,
            highlight=False,
        )
        order = ", ".join(str(r) for r in detection.stalled_first)
        wait = f"; all ranks wait in {detection.common_wait}" if detection.common_wait else ""
        output.console.print(f"  stalled first: rank {order}{wait}", markup=False, highlight=False)
        for rank in detection.ranks:
            output.console.print(
                f"  rank {rank.rank} on {rank.node} (pid {rank.pid}): {rank.reports} reports, waiting in "
                f"{rank.waiting_in or '?'}",
                markup=False,
                highlight=False,
            )
            if stacks:
                body = rank.stack or f"(no stack: {rank.stack_error})"
                output.console.print("    " + body.rstrip().replace("\n", "\n    "), markup=False, highlight=False)
                for line in rank.log_tail[-5:]:
                    output.console.print(f"    | {line}", markup=False, highlight=False)


def _hang_metadata(timeout: str | None, action: str | None, rules: Path | None) -> dict[str, str]:
    """The --hang-* flags as the job metadata a plain ``ray job submit --metadata-json`` would carry."""
    metadata = {}
    if timeout is not None:
        metadata["raypod.hang_timeout"] = timeout
    if action is not None:
        metadata["raypod.hang_action"] = action
    if rules is not None:
        try:
            metadata["raypod.hang_rules"] = rules.read_text()
        except OSError as exc:
            raise errors.InvalidSpec(f"--hang-rules {rules}: {exc.strerror}") from None
    try:
        spec_mod.hang_overrides_from_metadata(metadata)
    except ValueError as exc:
        raise errors.InvalidSpec(str(exc)) from None
    return metadata


def _render(job: state.JobView, fmt: Format) -> None:
    output.emit_one(job, fmt, _describe)


def _describe(job: state.JobView) -> str:
    lines = [f"job {job.id} on {job.namespace}/{job.cluster}: [bold]{job.status.value}[/bold]"]
    for number, attempt in enumerate(job.attempts, start=1):
        lines.append(f"  attempt {number}: {attempt.submission_id}  {attempt.status}  {attempt.message[:80]}")
    return "\n".join(lines)


app.command("schedule")(schedules.schedule)
