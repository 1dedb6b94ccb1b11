#!/usr/bin/env bash
# Real Kubernetes control plane for the end-to-end tests: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler driven by kwokctl (kwok as the
# fake kubelet), plus the agent-sandbox controller running out of cluster.
#
#   tests/k8s/testenv.sh build    build the binaries from the Go module proxy (cached)
#   tests/k8s/testenv.sh up       start the cluster (idempotent)
#   tests/k8s/testenv.sh down     stop everything `up` started (safe to repeat)
#   tests/k8s/testenv.sh status   show what is running
#   tests/k8s/testenv.sh env      print `export KUBECONFIG=...` (and the exec root and bin dir)
#
# Everything binds to 127.0.0.1. Binaries live in a cache outside the repo,
# pids/logs/kubeconfig in a state dir outside the repo.
set -euo pipefail

# --- pinned versions ---------------------------------------------------------
K8S_VERSION=1.36.3    # kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
ETCD_VERSION=3.6.16
KWOK_VERSION=0.8.0
SANDBOX_VERSION=0.5.6 # agent-sandbox controller + CRDs (v1beta1 storage)

VERSION_KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_agent-sandbox-${SANDBOX_VERSION}"
CACHE_ROOT=${CONTEXT_SERVICE_TESTENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/context-service-testenv}
BIN=$CACHE_ROOT/$VERSION_KEY/bin
# agent-sandbox's CRD manifests, copied from the module at build time.
CRDS=$CACHE_ROOT/$VERSION_KEY/agent-sandbox-crds
STATE=${CONTEXT_SERVICE_TESTENV_STATE:-${XDG_RUNTIME_DIR:-/tmp}/context-service-testenv}
CLUSTER=cs-e2e
KUBECONFIG_PATH=$STATE/kubeconfig
# Per-pod exec working directories (kwok runs exec'd commands on this host).
EXEC_ROOT=$STATE/exec

SELF=$(readlink -f "${BASH_SOURCE[0]}")
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

log() { printf 'testenv: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# Go builds run at the lowest priority: the machine is shared with Rust builds.
gorun() { nice -n 19 env CGO_ENABLED=0 GOTOOLCHAIN=local "$@"; }

have_bins() {
	local b
	for b in "$@"; do
		[ -x "$BIN/$b" ] || return 1
	done
}

# Runs build step "$1" (a function of this script) in a fresh process, so that
# errexit applies inside it, with its output in a log whose tail is shown on
# failure.
quietly() {
	local name=$1
	shift
	local logf="$CACHE_ROOT/$VERSION_KEY/build-$name.log"
	if ! "$SELF" __step "$@" >"$logf" 2>&1; then
		log "building $name failed; last lines of $logf:"
		tail -n 40 "$logf" >&2
		return 1
	fi
}

# Throwaway module that builds the Kubernetes commands at one release.
# Resolving and downloading it is network-bound, so cmd_build runs this in
# parallel with the smaller builds.
prepare_k8s() {
	local w=$1 staging kmod m
	staging="v0.${K8S_VERSION#1.}"
	cd "$w"
	gorun go mod init local/k8sbuild
	kmod=$(gorun go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | jq -r .GoMod)
	# k8s.io/kubernetes requires its staging modules at the non-existent v0.0.0
	# and replaces them with ./staging paths, which do not apply to a dependency:
	# point every one of them at its published tag instead.
	gorun go mod edit -go="$(awk '$1=="go"{print $2; exit}' "$kmod")"
	for m in $({
		awk '$1 ~ /^k8s\.io\// && $2=="v0.0.0" {print $1}' "$kmod"
		awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}' "$kmod"
	} | sort -u); do
		gorun go mod edit -replace="$m=$m@$staging"
	done
	gorun go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" \
		"k8s.io/kubernetes/cmd/kube-controller-manager@v$K8S_VERSION" \
		"k8s.io/kubernetes/cmd/kube-scheduler@v$K8S_VERSION" \
		"k8s.io/kubernetes/cmd/kubectl@v$K8S_VERSION"
	# Fetch every package's module now, not during the compile.
	gorun go list -deps -test=false tool >/dev/null
}

build_k8s() {
	local w=$1 minor ld p b
	minor=$(echo "$K8S_VERSION" | cut -d. -f2)
	cd "$w"
	ld="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld="$ld -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
	done
	mkdir -p out
	# One invocation: the binaries share most compiled packages.
	gorun go build -trimpath -ldflags "$ld" -o out/ k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kubectl
	for b in "${K8S_BINS[@]}"; do mv "out/$b" "$BIN/$b"; done
}

build_etcd() {
	have_bins etcd && return 0
	local w
	w=$(mktemp -d)
	(
		cd "$w"
		gorun go mod init local/etcdbuild
		# server/go.mod has replace directives, so `go install` refuses it; the
		# module root is etcd's main package and builds fine as a dependency.
		gorun go get -tool "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
		gorun go build -trimpath -ldflags "-s -w" -o out/etcd go.etcd.io/etcd/server/v3
		mv out/etcd "$BIN/etcd"
	)
	rm -rf "$w"
}

build_kwok() {
	have_bins kwok kwokctl && return 0
	local w
	w=$(mktemp -d)
	gorun env GOBIN="$w" go install -trimpath -ldflags "-s -w" \
		"sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@v$KWOK_VERSION"
	mv "$w/kwok" "$w/kwokctl" "$BIN/"
	rm -rf "$w"
}

build_sandbox() {
	have_bins agent-sandbox-controller && [ -d "$CRDS" ] && return 0
	local w dir
	w=$(mktemp -d)
	(
		cd "$w"
		gorun go mod init local/sandboxbuild
		# Not `go install pkg@version`: that also reads the module's version list
		# for deprecation notices, which the proxy refuses (403) for this module.
		gorun go get -tool "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@v$SANDBOX_VERSION"
		gorun go build -trimpath -ldflags "-s -w" -o out/agent-sandbox-controller \
			sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
		dir=$(gorun go mod download -json "sigs.k8s.io/agent-sandbox@v$SANDBOX_VERSION" | jq -r .Dir)
		mkdir -p out/crds
		cp "$dir"/k8s/crds/*.yaml out/crds/
		mv out/agent-sandbox-controller "$BIN/"
		rm -rf "$CRDS"
		mv out/crds "$CRDS"
	)
	rm -rf "$w"
}

cmd_build() {
	local gov
	command -v go >/dev/null || die "no Go toolchain on PATH (need Go >= 1.26)"
	gov=$(GOTOOLCHAIN=local go env GOVERSION)
	case "$gov" in
	go1.2[6-9]* | go1.[3-9][0-9]* | go[2-9]*) ;;
	*) die "need Go >= 1.26 to build Kubernetes $K8S_VERSION, found $gov" ;;
	esac
	command -v jq >/dev/null || die "jq is required"
	mkdir -p "$BIN"
	# Binaries are moved into $BIN only when complete, so a present file is a
	# finished build and is never rebuilt.
	local w="" prep=""
	if ! have_bins "${K8S_BINS[@]}"; then
		w=$(mktemp -d)
		quietly kubernetes-prepare prepare_k8s "$w" &
		prep=$!
	fi
	local rc=0
	quietly etcd build_etcd || rc=1
	quietly kwok build_kwok || rc=1
	quietly agent-sandbox build_sandbox || rc=1
	if [ -n "$prep" ]; then
		if wait "$prep"; then
			quietly kubernetes build_k8s "$w" || rc=1
		else
			rc=1
		fi
		rm -rf "$w"
	fi
	[ "$rc" = 0 ] || die "build failed (logs in $CACHE_ROOT/$VERSION_KEY)"
}

# --- cluster -----------------------------------------------------------------

export KWOK_WORKDIR=$STATE/kwok
CLUSTER_DIR=$KWOK_WORKDIR/clusters/$CLUSTER
CONTROLLER_PID=$STATE/agent-sandbox-controller.pid
CONTROLLER_LOG=$STATE/agent-sandbox-controller.log

kubectl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# A pid from pid file "$1" counts only while it runs a binary from our cache
# dir: never signal a recycled pid, and zombies (no exe) count as gone. A
# binary replaced by a rebuild while running shows as "<path> (deleted)".
pid_alive() {
	local pid exe
	[ -f "$1" ] || return 1
	pid=$(cat "$1")
	exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
	exe=${exe% (deleted)}
	[ "${exe%/*}" -ef "$BIN" ]
}

apiserver_healthy() {
	[ -f "$KUBECONFIG_PATH" ] && kubectl get --raw /readyz --request-timeout=5s >/dev/null 2>&1
}

# Names of started components that are no longer running.
dead_components() {
	local f
	for f in "$CLUSTER_DIR"/pids/*.pid "$CONTROLLER_PID"; do
		[ -e "$f" ] || continue
		pid_alive "$f" || basename "$f" .pid
	done
}

log_of() {
	if [ "$1" = agent-sandbox-controller ]; then
		echo "$CONTROLLER_LOG"
	else
		echo "$CLUSTER_DIR/logs/$1.log"
	fi
}

# Reports a failed `up` with the log tails of the components that died (or,
# if all still run, of the apiserver and the agent-sandbox controller).
fail_up() {
	local c dead
	log "error: $*"
	dead=$(dead_components)
	[ -z "$dead" ] || log "not running: $(echo "$dead" | tr '\n' ' ')"
	for c in ${dead:-kube-apiserver agent-sandbox-controller}; do
		[ -s "$(log_of "$c")" ] || continue
		log "--- last lines of $(log_of "$c")"
		tail -n 20 "$(log_of "$c")" >&2
	done
	log "the partial cluster is left for inspection; '$0 down' removes it"
	exit 1
}

check_components() {
	[ -z "$(dead_components)" ] || fail_up "a component exited"
}

write_kwok_config() {
	mkdir -p "$KWOK_WORKDIR"
	# Every binary is local: kwokctl must never download anything.
	cat >"$KWOK_WORKDIR/kwok.yaml" <<EOF
kind: KwokctlConfiguration
apiVersion: config.kwok.x-k8s.io/v1alpha1
options:
  runtime: binary
  bindAddress: 127.0.0.1
  kubeApiserverBinary: $BIN/kube-apiserver
  kubeControllerManagerBinary: $BIN/kube-controller-manager
  kubeSchedulerBinary: $BIN/kube-scheduler
  kubectlBinary: $BIN/kubectl
  etcdBinary: $BIN/etcd
  kwokControllerBinary: $BIN/kwok
EOF
}

create_cluster() {
	local out
	write_kwok_config
	# Exec/ClusterExec as CRDs so tests can create per-pod exec rules at runtime;
	# the hostPath provisioner makes PVCs bind (directories under /tmp/hostpath_pv).
	if ! out=$("$BIN/kwokctl" create cluster --name "$CLUSTER" \
		--kubeconfig "$KUBECONFIG_PATH" \
		--enable-crds Exec,ClusterExec \
		--disable-qps-limits \
		--extra-args kube-controller-manager=enable-hostpath-provisioner=true \
		--extra-args etcd=unsafe-no-fsync=true \
		--wait 3m 2>&1); then
		printf '%s\n' "$out" >&2
		fail_up "kwokctl create cluster failed"
	fi
}

# One kwok node. Only loopback addresses: the apiserver dials the node's
# address for exec/logs, and that must reach kwok's server on 127.0.0.1.
apply_node_and_storage() {
	kubectl apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-0
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: kwok-node-0
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  addresses:
  - {type: InternalIP, address: 127.0.0.1}
  - {type: Hostname, address: 127.0.0.1}
  allocatable: {cpu: "64", memory: 256Gi, pods: "1000"}
  capacity: {cpu: "64", memory: 256Gi, pods: "1000"}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: wait-for-consumer
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
EOF
	kubectl wait --for=condition=Ready node/kwok-node-0 --timeout=60s >/dev/null ||
		fail_up "kwok node did not become Ready"
}

# The agent-sandbox CRDs as shipped declare a conversion webhook served by the
# in-cluster controller; out of cluster nothing can serve it. Keep only
# v1beta1 (the storage version) and drop the webhook.
install_sandbox_crds() {
	local f crd
	for f in "$CRDS"/*.yaml; do
		kubectl create --dry-run=client -o json -f "$f" |
			jq '.spec.conversion = {strategy: "None"}
			    | .spec.versions |= map(select(.name == "v1beta1"))' |
			kubectl apply --server-side --force-conflicts -f - >/dev/null ||
			fail_up "installing $f failed"
	done
	for crd in sandboxes.agents.x-k8s.io sandboxclaims.extensions.agents.x-k8s.io \
		sandboxtemplates.extensions.agents.x-k8s.io sandboxwarmpools.extensions.agents.x-k8s.io; do
		kubectl wait --for=condition=Established "crd/$crd" --timeout=60s >/dev/null ||
			fail_up "CRD $crd not established"
	done
}

# Label domains the claim controller lets a SandboxClaim put on its pod
# (`additionalPodMetadata`). v0.5.6 reads them only from the hard-coded file
# /etc/sandbox-config/allowed-label-domains (no flag, no env var; default
# `sandbox.users.io`), and rejects our pool label `context.rossoctl.io/pool`
# with `InvalidMetadata` otherwise. The file lives in the state dir and is
# overlaid on /etc in a private mount namespace of the controller only.
ALLOWED_LABEL_DOMAINS="sandbox.users.io,context.rossoctl.io"
SANDBOX_ETC=$STATE/sandbox-etc
CONTROLLER_STAMP=$STATE/agent-sandbox-controller.settings
# Extra controller flags (word-split), e.g. its burst settings; a running
# controller started with other flags or domains is restarted.
SANDBOX_CONTROLLER_ARGS=${SANDBOX_CONTROLLER_ARGS:-}
CONTROLLER_SETTINGS="allowed label domains $ALLOWED_LABEL_DOMAINS; flags: $SANDBOX_CONTROLLER_ARGS"

start_controller() {
	if pid_alive "$CONTROLLER_PID"; then
		# A controller started without (or with other) allowed domains, e.g.
		# by an older version of this script, is restarted.
		[ "$(cat "$CONTROLLER_STAMP" 2>/dev/null)" = "$CONTROLLER_SETTINGS" ] && return 0
		log "restarting agent-sandbox-controller with $CONTROLLER_SETTINGS"
		kill_pidfile "$CONTROLLER_PID"
	fi
	local extra=()
	read -ra extra <<<"$SANDBOX_CONTROLLER_ARGS"
	mkdir -p "$SANDBOX_ETC/sandbox-config"
	echo "$ALLOWED_LABEL_DOMAINS" >"$SANDBOX_ETC/sandbox-config/allowed-label-domains"
	# No webhook (CRDs have no conversion), no leader election (one replica, out
	# of cluster), metrics/probes off so nothing listens on a non-loopback port.
	# `unshare -m` + `exec` keep the controller's pid in the pid file; the
	# read-only overlay adds sandbox-config/ to /etc for this process only.
	# shellcheck disable=SC2016 # $1 and $@ are the inner shell's.
	KUBECONFIG=$KUBECONFIG_PATH setsid unshare --mount --propagation private sh -c '
		mount -t overlay overlay -o "lowerdir=$1:/etc" /etc || exit 97
		shift
		exec "$@"' sh "$SANDBOX_ETC" "$BIN/agent-sandbox-controller" \
		--extensions=true \
		--enable-webhook=false \
		--leader-elect=false \
		--metrics-bind-address=0 \
		--health-probe-bind-address=0 \
		--kube-api-burst=200 \
		"${extra[@]}" \
		>"$CONTROLLER_LOG" 2>&1 </dev/null &
	echo $! >"$CONTROLLER_PID"
	sleep 2
	pid_alive "$CONTROLLER_PID" || fail_up "agent-sandbox-controller exited at start-up"
	# What the controller itself reads, through its own mount namespace.
	[ "$(cat "/proc/$(cat "$CONTROLLER_PID")/root/etc/sandbox-config/allowed-label-domains" 2>/dev/null)" = "$ALLOWED_LABEL_DOMAINS" ] ||
		fail_up "agent-sandbox-controller does not see its allowed label domains"
	echo "$CONTROLLER_SETTINGS" >"$CONTROLLER_STAMP"
}

cmd_up() {
	local b
	for b in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl agent-sandbox-controller; do
		[ -x "$BIN/$b" ] || die "$BIN/$b is missing; run '$0 build' first"
	done
	[ -d "$CRDS" ] || die "$CRDS is missing; run '$0 build' first"
	mkdir -p "$STATE" "$EXEC_ROOT"
	if [ -d "$CLUSTER_DIR" ] && ! apiserver_healthy; then
		log "found a stale cluster in $STATE; removing it"
		cmd_down
		mkdir -p "$STATE" "$EXEC_ROOT"
	fi
	if ! apiserver_healthy; then
		create_cluster
	fi
	check_components
	apply_node_and_storage
	install_sandbox_crds
	start_controller
	# kwokctl's --wait does not notice a controller-manager or scheduler that
	# died at start-up; by now they would have.
	check_components
}

kill_pidfile() {
	local f=$1 pid i
	[ -f "$f" ] || return 0
	if pid_alive "$f"; then
		pid=$(cat "$f")
		kill "$pid" 2>/dev/null || true
		for i in $(seq 50); do
			pid_alive "$f" || break
			[ "$i" = 50 ] && kill -9 "$pid" 2>/dev/null
			sleep 0.1
		done
	fi
	rm -f "$f"
}

cmd_down() {
	local f saved=$STATE/stopping
	kill_pidfile "$CONTROLLER_PID"
	rm -f "$CONTROLLER_STAMP"
	if [ -d "$CLUSTER_DIR" ]; then
		# kwokctl signals its components and removes their pid files without
		# waiting; keep copies to wait for (and if need be kill) them ourselves.
		rm -rf "$saved"
		mkdir -p "$saved"
		cp "$CLUSTER_DIR"/pids/*.pid "$saved"/ 2>/dev/null || true
		"$BIN/kwokctl" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
		for f in "$saved"/*.pid; do
			[ -e "$f" ] && kill_pidfile "$f"
		done
		rm -rf "$saved" "$CLUSTER_DIR"
	fi
	rm -f "$KUBECONFIG_PATH"
	rm -rf "$EXEC_ROOT"
}

cmd_status() {
	local f name rc=0
	if [ ! -d "$CLUSTER_DIR" ]; then
		echo "down"
		return 1
	fi
	for f in "$CLUSTER_DIR"/pids/*.pid "$CONTROLLER_PID"; do
		[ -e "$f" ] || continue
		name=$(basename "$f" .pid)
		if pid_alive "$f"; then
			echo "$name: running (pid $(cat "$f"))"
		else
			echo "$name: NOT running"
			rc=1
		fi
	done
	if apiserver_healthy; then
		echo "apiserver: ready ($(kubectl config view -o jsonpath='{.clusters[0].cluster.server}'))"
		echo "kubeconfig: $KUBECONFIG_PATH"
	else
		echo "apiserver: NOT ready"
		rc=1
	fi
	return "$rc"
}

cmd_env() {
	apiserver_healthy || die "the cluster is not up; run '$0 up'"
	echo "export KUBECONFIG=$KUBECONFIG_PATH"
	# Directory on this host under which tests put per-pod exec working dirs.
	echo "export CONTEXT_SERVICE_TESTENV_EXEC_ROOT=$EXEC_ROOT"
	# The kubectl built with the control plane (tests/k8s/deploy-check.sh).
	echo "export CONTEXT_SERVICE_TESTENV_KUBECTL=$BIN/kubectl"
	# The cached binaries, e.g. the matching kubectl for benchmarks.
	echo "export CONTEXT_SERVICE_TESTENV_BIN=$BIN"
}

main() {
	case "${1:-}" in
	build) cmd_build ;;
	up) cmd_up ;;
	down) cmd_down ;;
	status) cmd_status ;;
	env) cmd_env ;;
	__step)
		shift
		"$@"
		;;
	*)
		echo "usage: $0 build|up|down|status|env" >&2
		exit 2
		;;
	esac
}

main "$@"
