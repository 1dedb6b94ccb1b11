#!/usr/bin/env bash
# The deploy manifests, proven against a real API server: renders
# deploy/base, deploy/overlays/kwok, deploy/overlays/ha and deploy/monitoring with
# `kubectl kustomize`, checks what each contains, and applies base and overlays
# to the test control plane with `--dry-run=server` (schemas, defaulting,
# admission and RBAC escalation checks of the real API server; nothing is
# stored). Namespaced objects need their namespace to exist, so each is
# applied into a fresh namespace made for the run and deleted after it.
# (deploy/monitoring needs the prometheus-operator CRDs, which the test
# cluster does not have: it is rendered only; its rules are checked with
# promtool by the API tests.)
#
# Needs the running test environment: eval "$(tests/k8s/testenv.sh env)".
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${KUBECONFIG:?start the environment first: eval \"\$(tests/k8s/testenv.sh env)\"}"
kubectl=${CONTEXT_SERVICE_TESTENV_KUBECTL:?run eval \"\$(tests/k8s/testenv.sh env)\"}

work=$(mktemp -d)
ns=cs-deploy-$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
created_ns=
cleanup() {
	if [ -n "$created_ns" ]; then
		"$kubectl" delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

fail() {
	echo "deploy-check: FAILED: $*" >&2
	exit 1
}

# kinds DIR: the rendered objects' kinds, sorted, one a line.
kinds() { awk '/^kind: /{print $2}' "$work/$1.yaml" | sort; }

expect_kinds() {
	local dir=$1 want=$2 got
	got=$(kinds "$dir" | uniq | tr '\n' ' ')
	[ "$got" = "$want" ] || fail "$dir renders [$got], expected [$want]"
}

passed=0
check() {
	echo "deploy-check: ok: $*"
	passed=$((passed + 1))
}

for dir in base overlays/kwok overlays/ha monitoring; do
	out="$work/${dir//\//-}.yaml"
	"$kubectl" kustomize "deploy/$dir" >"$out" || fail "kubectl kustomize deploy/$dir"
	check "kubectl kustomize deploy/$dir ($(grep -c '^kind: ' "$out") objects)"
done
app="ClusterRole ClusterRoleBinding ConfigMap Namespace NetworkPolicy Role RoleBinding Secret Service ServiceAccount StatefulSet "
expect_kinds base "$app"
expect_kinds overlays-kwok "$app"
# Several replicas on shared stores: a Deployment and its PodDisruptionBudget
# in place of the StatefulSet.
expect_kinds overlays-ha "$(sed 's/StatefulSet /Deployment PodDisruptionBudget /' <<<"$app" | tr ' ' '\n' | grep . | sort | tr '\n' ' ')"
expect_kinds monitoring "ConfigMap PrometheusRule ServiceMonitor "

grep -q 'storage: 1Gi' "$work/overlays-kwok.yaml" || fail "the kwok overlay's volume patch did not apply"
check "rendered kinds"

"$kubectl" create namespace "$ns" >/dev/null || fail "creating namespace $ns"
created_ns=1
for dir in base overlays/kwok overlays/ha; do
	wrap="$work/wrap-${dir//\//-}"
	mkdir -p "$wrap"
	cat >"$wrap/kustomization.yaml" <<-YAML
		apiVersion: kustomize.config.k8s.io/v1beta1
		kind: Kustomization
		namespace: $ns
		resources:
		  - $(realpath --relative-to="$wrap" "deploy/$dir")
	YAML
	objects=$("$kubectl" kustomize "$wrap" | grep -c '^kind: ')
	result=$("$kubectl" kustomize "$wrap" | "$kubectl" apply --dry-run=server -f - 2>&1) ||
		fail "server dry run of deploy/$dir:"$'\n'"$result"
	accepted=$(grep -c '(server dry run)$' <<<"$result" || true)
	[ "$accepted" = "$objects" ] ||
		fail "deploy/$dir: the API server accepted $accepted of $objects objects:"$'\n'"$result"
	check "kubectl apply --dry-run=server deploy/$dir ($accepted objects)"
done
echo "deploy-check: $passed passed, 0 failed"
