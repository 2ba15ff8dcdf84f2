#!/usr/bin/env bash
# Checks, on a real Kubernetes cluster with the KubeRay operator installed and raypod's server running there
# (`helm install raypod deploy/helm/raypod`, RAYPOD_BACKEND=kuberay), what raypod's tests can only check against an
# emulated API server: that workspaces, hang detection's agent, health checks and the managed L2 run in real pods.
# A few minutes. Needs: kubectl (with the cluster's context), the raypod CLI logged in to that server
# (`raypod login` or RAYPOD_SERVER + a token), and a Ray image with raypod installed (SMOKE_IMAGE).
#
#   SMOKE_IMAGE=registry.example/ray-raypod:2.60 scripts/k8s-smoke.sh
#
# Leaves nothing behind but the workspace's files' claim it proves is kept (deleted at the end with --delete-files).
set -euo pipefail

NS="${SMOKE_NAMESPACE:-default}"
NAME="${SMOKE_CLUSTER:-raypod-smoke}"
IMAGE="${SMOKE_IMAGE:?set SMOKE_IMAGE to a Ray image with raypod installed (pip install raypod)}"
DEADLINE_S="${SMOKE_TIMEOUT_S:-300}"
spec="$(mktemp)"
trap 'rm -f "$spec"; raypod cluster delete "$NAME" -n "$NS" --no-wait >/dev/null 2>&1 || true' EXIT

say() { printf '\n== %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }
until_true() {  # until_true "what" command...: retry for DEADLINE_S seconds
  local what="$1"; shift
  local end=$((SECONDS + DEADLINE_S))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || fail "$what (after ${DEADLINE_S}s)"
    sleep 3
  done
  echo "ok: $what"
}
containers_of() { kubectl -n "$NS" get pods -l "ray.io/cluster=$NAME,ray.io/group=$1" \
  -o jsonpath='{.items[*].spec.containers[*].name}'; }

kubectl get crd rayclusters.ray.io >/dev/null || fail "KubeRay's CRDs are not installed"
raypod cluster list -n "$NS" >/dev/null || fail "the raypod CLI cannot reach its server"

say "a cluster with hang detection and a health check"
cat >"$spec" <<EOF
name: $NAME
namespace: $NS
image: $IMAGE
head: {cpus: 1, memory: 2Gi}
worker_groups: [{name: w, replicas: 1, cpus: 1, memory: 1Gi}]
hangwatch: {enabled: true}
health_checks: [{name: tmp-writable, command: "test -w /tmp", period_s: 10, timeout_s: 5}]
EOF
raypod cluster create "$NAME" -f "$spec" --timeout "$DEADLINE_S"
[[ " $(containers_of w) " == *" raypod-hangwatch-agent "* ]] || fail "no hangwatch agent in the worker pod"
echo "ok: the agent runs beside Ray in the worker pod"
until_true "the agents report (raypod job hangs answers)" raypod job hangs "$NAME" -n "$NS"
sleep 10  # a few of the agents' polls
if kubectl -n "$NS" logs -l "ray.io/cluster=$NAME" -c raypod-hangwatch-agent --tail=50 | grep -q "cannot report"; then
  fail "an agent cannot reach the control plane (RAYPOD_NODE_URL)"
fi
kubectl -n "$NS" get secret "$NAME-raypod-sidecars" >/dev/null || fail "no sidecar Secret"
raypod cluster get "$NAME" -n "$NS" -o json | grep -q '"health": "Healthy"' || fail "nodes not Healthy"
echo "ok: health checks ran in the pods (pods/exec) and found them healthy"

say "a job"
raypod job submit -c "$NAME" -n "$NS" -- python -c "import ray; ray.init(); print('smoke', ray.cluster_resources())" \
  | grep -q smoke || fail "the job did not run"
echo "ok: a job ran"

say "a workspace: create, stop, start, delete (its files' claim kept)"
raypod space create nb -c "$NAME" -n "$NS"
[[ " $(containers_of space-nb) " == *" raypod-ide "* ]] || fail "no IDE container in the workspace's pod"
claim="$(kubectl -n "$NS" get pvc -l app.kubernetes.io/managed-by=raypod -o name | head -1)"
[[ -n "$claim" ]] || fail "no PersistentVolumeClaim for the workspace's files"
raypod space stop nb -n "$NS"
until_true "the workspace's pod gone" bash -c "[[ -z \"\$(kubectl -n $NS get pods -l ray.io/group=space-nb -o name)\" ]]"
kubectl -n "$NS" get "$claim" >/dev/null || fail "a stopped workspace lost its files' claim"
raypod space start nb -n "$NS"
until_true "the workspace Ready again" bash -c "raypod space get nb -n $NS | grep -q Ready"
raypod space delete nb -n "$NS" --keep-files --yes
kubectl -n "$NS" get "$claim" >/dev/null || fail "a deleted workspace (--keep-files) lost its files' claim"
echo "ok: the claim outlived the workspace"
kubectl -n "$NS" delete "$claim" --wait=false >/dev/null

say "the managed L2 (a model deployment without --l2), when SMOKE_MODEL names a catalogued model"
if [[ -n "${SMOKE_MODEL:-}" ]]; then
  raypod serve deploy "$SMOKE_MODEL" -c "$NAME" -n "$NS" --name smoke --no-wait
  until_true "the Valkey Deployment" kubectl -n "$NS" rollout status "deployment/$NAME-raypod-kv" --timeout=10s
  kubectl -n "$NS" get networkpolicy "$NAME-raypod-kv" >/dev/null || fail "no NetworkPolicy for the L2"
  raypod serve delete smoke -c "$NAME" -n "$NS"
  echo "ok: the L2 runs, password-protected, reachable only from the cluster's serving pods"
else
  echo "skipped (set SMOKE_MODEL)"
fi

say "cleanup"
raypod cluster delete "$NAME" -n "$NS"
echo "all checks passed"
