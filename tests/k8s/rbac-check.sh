#!/usr/bin/env bash
# The deploy's RBAC grants nothing the code does not use. The e2e tests run
# every service as the deploy's ServiceAccount with the RBAC of deploy/base
# (tests/common/rbac.rs), which proves that it grants everything the code
# uses. This script proves the converse: for every verb of every rule of the
# rendered Roles and ClusterRoles it renders the deploy without that one
# verb, runs the tests mapped to it below as that ServiceAccount, and
# requires that
#   * at least one of them fails, and
#   * the API server answered the service 403 for exactly that verb and
#     resource (so the failure is the removal's, not load or a flake).
# It also requires that every grant is mapped and every mapping is a grant,
# and (unless RBAC_CHECK_BASELINE=0, for a caller that has just run the
# whole e2e suite with the full RBAC, as tests/k8s/run-e2e.sh does) that the
# mapped tests pass with the full RBAC.
#
# Each removal runs only the one or two tests that exercise it, with the
# tests' waits cut to CONTEXT_SERVICE_E2E_TIMEOUT=${RBAC_CHECK_TIMEOUT:-30}
# seconds: a full e2e run per removal would cost over half an hour.
# RBAC_CHECK_ONLY=<regex> restricts the sweep to matching grants
# ("Role agents.x-k8s.io/sandboxes patch").
#
# Needs the running test environment: eval "$(tests/k8s/testenv.sh env)".
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${KUBECONFIG:?start the environment first: eval \"\$(tests/k8s/testenv.sh env)\"}"
kubectl=${CONTEXT_SERVICE_TESTENV_KUBECTL:?run eval \"\$(tests/k8s/testenv.sh env)\"}

pools=k8s_pools_e2e
delivery=k8s_delivery_e2e
# Grant ("<kind> <apiGroup or core>/<resource> <verb>") -> the tests
# ("<test target>:<test name>") that must fail without it.
declare -A mapped=(
	["Role agents.x-k8s.io/sandboxes create"]="$pools:dedicated_pool_gets_one_owned_rwo_pvc_per_sandbox"
	["Role agents.x-k8s.io/sandboxes delete"]="$pools:half_created_pool_is_rolled_back_completely"
	["Role agents.x-k8s.io/sandboxes deletecollection"]="$pools:dedicated_pool_gets_one_owned_rwo_pvc_per_sandbox"
	["Role agents.x-k8s.io/sandboxes list"]="$pools:dedicated_pool_gets_one_owned_rwo_pvc_per_sandbox"
	["Role agents.x-k8s.io/sandboxes watch"]="$pools:dedicated_pool_gets_one_owned_rwo_pvc_per_sandbox"
	["Role agents.x-k8s.io/sandboxes patch"]="$pools:lifetime::suspend_and_resume_remove_and_restore_pods_keeping_volumes"
	["Role extensions.agents.x-k8s.io/sandboxclaims create"]="$pools:warm_pool_claims_bind_warm_sandboxes_and_release_them"
	["Role extensions.agents.x-k8s.io/sandboxclaims delete"]="$pools:half_created_warm_pool_is_rolled_back_completely"
	["Role extensions.agents.x-k8s.io/sandboxclaims deletecollection"]="$pools:a_warm_pool_with_a_claim_beyond_its_replicas_is_deleted_by_its_labels"
	["Role extensions.agents.x-k8s.io/sandboxclaims list"]="$pools:warm_pool_claims_bind_warm_sandboxes_and_release_them"
	["Role extensions.agents.x-k8s.io/sandboxclaims watch"]="$pools:warm_pool_claims_bind_warm_sandboxes_and_release_them"
	["Role extensions.agents.x-k8s.io/sandboxclaims patch"]="$pools:warm_pool_claims_bind_warm_sandboxes_and_release_them"
	["Role extensions.agents.x-k8s.io/sandboxwarmpools get"]="$pools:warm_pool_claims_bind_warm_sandboxes_and_release_them"
	["Role core/persistentvolumeclaims watch"]="$pools:readyz_reaches_the_kubernetes_api"
	["Role core/persistentvolumeclaims deletecollection"]="$pools:dedicated_pool_gets_one_owned_rwo_pvc_per_sandbox"
	["Role core/persistentvolumeclaims patch"]="$pools:dedicated_pool_gets_one_owned_rwo_pvc_per_sandbox"
	["Role core/pods get"]="$delivery:delivery_lifecycle_through_kube_exec"
	["Role core/pods list"]="$pools:dedicated_pool_gets_one_owned_rwo_pvc_per_sandbox"
	["Role core/pods watch"]="$pools:readyz_reaches_the_kubernetes_api"
	["Role core/pods/exec get"]="$delivery:delivery_lifecycle_through_kube_exec"
	["Role core/pods/exec create"]="$delivery:delivery_lifecycle_through_kube_exec"
	["ClusterRole core/persistentvolumeclaims create"]="$pools:rbac::named_context_in_another_namespace_uses_the_cluster_role"
	["ClusterRole core/persistentvolumeclaims get"]="$pools:rbac::named_context_in_another_namespace_uses_the_cluster_role"
	["ClusterRole core/persistentvolumeclaims list"]="$pools:rbac::named_context_in_another_namespace_uses_the_cluster_role"
	["ClusterRole core/persistentvolumeclaims delete"]="$pools:rbac::named_context_in_another_namespace_uses_the_cluster_role"
	["ClusterRole storage.k8s.io/storageclasses get"]="$pools:binding::sandboxes_are_made_once_their_volumes_are_bound"
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
	echo "rbac-check: FAILED: $*" >&2
	exit 1
}

"$kubectl" kustomize deploy/base >"$work/base.yaml" || fail "kubectl kustomize deploy/base"
"$kubectl" create --dry-run=client -o json -f "$work/base.yaml" | jq -s . >"$work/base.json" ||
	fail "converting the rendered deploy to JSON"

# kind, name, rule index, apiGroup ("core" for ""), resource, verb: one
# grant a line (no empty field: read would merge adjacent tabs).
jq -r '.[] | select(.kind == "Role" or .kind == "ClusterRole") | . as $o
	| .rules | to_entries[] | .key as $i | .value as $r
	| if ($r.apiGroups | length) != 1 or ($r.resources | length) != 1
	  then error("\($o.kind) \($o.metadata.name) rule \($i): one apiGroup and one resource per rule, please")
	  else . end
	| $r.verbs[] as $v
	| [$o.kind, $o.metadata.name, ($i | tostring), ($r.apiGroups[0] | if . == "" then "core" else . end),
	   $r.resources[0], $v] | @tsv' \
	"$work/base.json" >"$work/grants.tsv" || fail "reading the rules of the rendered Roles"

key() { echo "$1 $4/$5 $6"; }
declare -A granted=()
while IFS=$'\t' read -r kind name idx group resource verb; do
	k=$(key "$kind" "$name" "$idx" "$group" "$resource" "$verb")
	[ -n "${mapped[$k]:-}" ] || fail "no test is mapped to the grant \"$k\": add one to this script (and a test that needs it)"
	granted[$k]=1
done <"$work/grants.tsv"
for k in "${!mapped[@]}"; do
	[ -n "${granted[$k]:-}" ] || fail "\"$k\" is mapped but deploy/base does not grant it"
done
echo "rbac-check: ${#granted[@]} grants, each mapped to a test"

# The 403 line (METHOD /path?query) that verb on resource produces.
forbidden_re() {
	local group=$1 resource=$2 verb=$3 base sub=
	case $resource in */*) sub=${resource#*/} resource=${resource%%/*} ;; esac
	if [ "$group" = core ]; then base="/api/v1/(namespaces/[^/]+/)?$resource"; else base="/apis/$group/[^/]+/(namespaces/[^/]+/)?$resource"; fi
	if [ -n "$sub" ]; then
		echo "^(GET|POST) $base/[^/?]+/$sub([?]|\$)"
		return
	fi
	case $verb in
	list | watch) echo "^GET $base([?]|\$)" ;;
	get) echo "^GET $base/[^/?]+([?]|\$)" ;;
	create) echo "^POST $base([?]|\$)" ;;
	patch) echo "^PATCH $base/[^/?]+([?]|\$)" ;;
	delete) echo "^DELETE $base/[^/?]+([?]|\$)" ;;
	deletecollection) echo "^DELETE $base([?]|\$)" ;;
	*) fail "no request pattern for verb $verb" ;;
	esac
}

# Did the log record a 403 for this verb?
denied() {
	local log=$1 group=$2 resource=$3 verb=$4 re
	re=$(forbidden_re "$group" "$resource" "$verb")
	[ -s "$log" ] || return 1
	# No `grep -q` after a pipe: it stops reading at the first match, the
	# grep before it dies of SIGPIPE, and pipefail fails the whole check.
	case $verb in
	watch) [ -n "$(grep -E "$re" "$log" | grep 'watch=true')" ] ;;
	list) [ -n "$(grep -E "$re" "$log" | grep -v 'watch=true')" ] ;;
	*) grep -Eq "$re" "$log" ;;
	esac
}

export CARGO_TERM_COLOR=never
cargo_test() { cargo test --locked --features e2e "$@"; }
cargo_test --no-run --test "$pools" --test "$delivery" 2>"$work/build.log" ||
	{ cat "$work/build.log" >&2; fail "building the e2e tests"; }

# run_mapped RBAC_FILE LOG_PREFIX TEST...: runs the tests (target:name) as
# the ServiceAccount with the RBAC in RBAC_FILE; status 0 when all passed.
run_mapped() {
	local rbac=$1 log=$2 rc=0 target names
	shift 2
	: >"$log.forbidden"
	for target in $(printf '%s\n' "$@" | cut -d: -f1 | sort -u); do
		names=$(printf '%s\n' "$@" | awk -F: -v t="$target" '$1 == t { sub(/^[^:]*:/, ""); print }')
		# shellcheck disable=SC2086 # one test name a word
		CONTEXT_SERVICE_E2E_RBAC=$rbac CONTEXT_SERVICE_E2E_FORBIDDEN_LOG=$log.forbidden \
			cargo_test --test "$target" -- --exact $names >>"$log.out" 2>&1 || rc=1
	done
	return $rc
}

if [ "${RBAC_CHECK_BASELINE:-1}" != 0 ]; then
	all=$(printf '%s\n' "${mapped[@]}" | tr ' ' '\n' | sort -u)
	# As a List, like each variant below (the tests read List documents).
	jq '{apiVersion: "v1", kind: "List", items: .}' "$work/base.json" >"$work/full.json"
	# shellcheck disable=SC2086
	run_mapped "$work/full.json" "$work/baseline" $all ||
		{ tail -n 80 "$work/baseline.out" >&2; fail "the mapped tests fail with the full RBAC"; }
	[ ! -s "$work/baseline.forbidden" ] ||
		{ cat "$work/baseline.forbidden" >&2; fail "the full RBAC still gets 403s"; }
	echo "rbac-check: ok: the mapped tests pass with the full RBAC"
fi

export CONTEXT_SERVICE_E2E_TIMEOUT=${RBAC_CHECK_TIMEOUT:-30}
passed=0 n=0
while IFS=$'\t' read -r kind name idx group resource verb; do
	k=$(key "$kind" "$name" "$idx" "$group" "$resource" "$verb")
	if [ -n "${RBAC_CHECK_ONLY:-}" ] && ! grep -Eq "$RBAC_CHECK_ONLY" <<<"$k"; then
		continue
	fi
	n=$((n + 1))
	variant="$work/without-$n.json"
	jq --arg k "$kind" --arg n "$name" --argjson i "$idx" --arg v "$verb" \
		'{apiVersion: "v1", kind: "List", items: map(
			if .kind == $k and .metadata.name == $n
			then .rules[$i].verbs -= [$v] | .rules |= map(select(.verbs | length > 0))
			else . end)}' "$work/base.json" >"$variant"
	started=$(date +%s)
	# shellcheck disable=SC2086
	if run_mapped "$variant" "$work/step-$n" ${mapped[$k]}; then
		tail -n 40 "$work/step-$n.out" >&2
		fail "without \"$k\" the tests still pass: ${mapped[$k]} (grant unused, or no test needs it)"
	fi
	if ! denied "$work/step-$n.forbidden" "$group" "$resource" "$verb"; then
		tail -n 60 "$work/step-$n.out" >&2
		echo "403s seen:" >&2
		cat "$work/step-$n.forbidden" >&2
		fail "without \"$k\" a test failed, but not on a 403 for it"
	fi
	echo "rbac-check: ok: without \"$k\" ${mapped[$k]//$'\n'/ } fails on a 403 ($(($(date +%s) - started)) s)"
	passed=$((passed + 1))
done <"$work/grants.tsv"
[ "$n" -gt 0 ] || fail "RBAC_CHECK_ONLY=${RBAC_CHECK_ONLY:-} matches no grant"
echo "rbac-check: $passed passed, 0 failed"
