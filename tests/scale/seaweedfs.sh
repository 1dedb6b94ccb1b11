#!/usr/bin/env bash
# A real S3-compatible object store for the object-storage tests: SeaweedFS
# (`weed server`: master + volume + filer + S3 gateway in one process).
#
#   tests/scale/seaweedfs.sh build   build `weed` from the Go module proxy (cached)
#   tests/scale/seaweedfs.sh up      start it and create the test bucket (idempotent)
#   tests/scale/seaweedfs.sh stop    stop the server, keep its state (`up` restarts it
#                                    on the same ports, credentials and data)
#   tests/scale/seaweedfs.sh down    stop what `up` started, remove its state (safe to repeat)
#   tests/scale/seaweedfs.sh status  show whether it runs
#   tests/scale/seaweedfs.sh env     print the AWS_* / CONTEXT_SERVICE_TEST_S3_* exports
#
# Everything binds to 127.0.0.1 on free ports picked at `up` (or
# CONTEXT_SERVICE_SEAWEEDFS_S3_PORT for the S3 port). It holds
# CONTEXT_SERVICE_SEAWEEDFS_VOLUMES (default 5) volumes of 64 MiB: deleted
# objects free their space only when a volume is vacuumed, so a long
# workload (the soak) needs more. The binary lives in a
# cache outside the repo, keyed by version; pid, log, data and credentials in
# a state dir outside the repo. The S3 gateway requires signed requests: the
# credentials are generated at `up` and written to the state dir.
set -euo pipefail

# --- pinned version ------------------------------------------------------------
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6

CACHE_ROOT=${CONTEXT_SERVICE_SEAWEEDFS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/context-service-seaweedfs}
BIN=$CACHE_ROOT/$SEAWEEDFS_VERSION/bin
STATE=${CONTEXT_SERVICE_SEAWEEDFS_STATE:-${XDG_RUNTIME_DIR:-/tmp}/context-service-seaweedfs}
PIDFILE=$STATE/weed.pid
LOGFILE=$STATE/weed.log
ENVFILE=$STATE/env
BUCKET=${CONTEXT_SERVICE_SEAWEEDFS_BUCKET:-context-service-test}
REGION=us-east-1

log() { printf 'seaweedfs: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# Go builds run at the lowest priority: the machine is shared with Rust builds.
gorun() { nice -n 19 env CGO_ENABLED=0 GOTOOLCHAIN=local "$@"; }

cmd_build() {
	[ -x "$BIN/weed" ] && return 0
	command -v go >/dev/null || die "no Go toolchain on PATH"
	mkdir -p "$BIN"
	local w logf=$CACHE_ROOT/$SEAWEEDFS_VERSION/build.log
	w=$(mktemp -d)
	# `go install .../weed@version` is refused (SeaweedFS's go.mod has a
	# `replace`); a throwaway module that requires it builds it as a dependency,
	# with the one replace that matters copied over.
	if ! (
		set -e
		cd "$w"
		gorun go mod init local/swbuild
		cat >>go.mod <<GOMOD
require github.com/seaweedfs/seaweedfs $SEAWEEDFS_VERSION
replace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0
GOMOD
		printf '//go:build tools\npackage tools\nimport _ "github.com/seaweedfs/seaweedfs/weed"\n' >tools.go
		gorun go mod tidy -e
		gorun go build -trimpath -ldflags "-s -w" -o out/weed github.com/seaweedfs/seaweedfs/weed
		# Moved into place only when complete: a present binary is a finished build.
		mv out/weed "$BIN/weed"
	) >"$logf" 2>&1; then
		rm -rf "$w"
		log "build failed; last lines of $logf:"
		tail -n 40 "$logf" >&2
		exit 1
	fi
	rm -rf "$w"
}

# A pid counts only while it runs our cached binary: never signal a recycled pid.
pid_alive() {
	local pid exe
	[ -f "$PIDFILE" ] || return 1
	pid=$(cat "$PIDFILE")
	exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
	exe=${exe% (deleted)}
	[ "${exe%/*}" -ef "$BIN" ]
}

# Right after `setsid ... &` the pid may still run the forked shell or
# setsid, not yet weed: that counts as starting, not as dead.
alive_or_starting() {
	local exe
	exe=$(readlink "/proc/$(cat "$PIDFILE")/exe" 2>/dev/null) || return 1
	case "${exe% (deleted)}" in
	*/weed) pid_alive ;;
	*) return 0 ;;
	esac
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A free port p whose gRPC companion p+10000 (SeaweedFS's default) is free too,
# both below the kernel's ephemeral range: a port inside it can be taken as
# the source port of any outgoing connection (weed's own among them) between
# this check and weed's bind, which failed a CI run with "bind: address
# already in use" on the S3 gateway's gRPC port.
free_port() {
	local p i lo=10000 hi ephemeral
	ephemeral=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
	hi=$((ephemeral - 10000 - 1))
	[ "$hi" -gt "$lo" ] || { lo=20000 hi=29999; }
	for i in $(seq 200); do
		p=$((lo + RANDOM % (hi - lo + 1)))
		port_free "$p" && port_free $((p + 10000)) && {
			echo "$p"
			return 0
		}
	done
	die "no free port found"
}

s3_ready() {
	# Any HTTP answer (403 for an unsigned request) means the gateway serves.
	curl -s -o /dev/null -m 2 "http://127.0.0.1:$1/" 2>/dev/null
}

# Signed S3 request with the generated credentials (curl's SigV4).
s3_curl() {
	# shellcheck disable=SC1090
	. "$ENVFILE"
	curl -sS -m 10 --aws-sigv4 "aws:amz:$REGION:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$@"
}

# Fresh ports, credentials and identities file in a new state dir.
init_state() {
	rm -rf "$STATE"
	mkdir -p "$STATE/data"
	local s3 key secret p
	s3=${CONTEXT_SERVICE_SEAWEEDFS_S3_PORT:-$(free_port)}
	key=cs$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
	secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
	cat >"$STATE/s3.json" <<EOF
{"identities": [{"name": "context-service-test",
  "credentials": [{"accessKey": "$key", "secretKey": "$secret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
	cat >"$ENVFILE" <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$s3
export AWS_REGION=$REGION
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_ALLOW_HTTP=true
export CONTEXT_SERVICE_TEST_S3_BUCKET=$BUCKET
EOF
	echo "$s3" >"$STATE/s3.port"
	# Four distinct ports (each with its gRPC companion at +10000).
	local ports=("$s3")
	while [ ${#ports[@]} -lt 4 ]; do
		p=$(free_port)
		case " ${ports[*]} " in *" $p "*) ;; *) ports+=("$p") ;; esac
	done
	echo "${ports[1]} ${ports[2]} ${ports[3]}" >"$STATE/ports"
}

cmd_up() {
	[ -x "$BIN/weed" ] || die "$BIN/weed is missing; run '$0 build' first"
	if pid_alive; then
		return 0
	fi
	# After `stop`: the same ports, credentials and data (clients keep working).
	if [ ! -f "$ENVFILE" ] || [ ! -f "$STATE/ports" ] || [ ! -d "$STATE/data" ]; then
		init_state
	fi
	local s3 master volume filer i
	s3=$(cat "$STATE/s3.port")
	read -r master volume filer <"$STATE/ports"
	setsid "$BIN/weed" server -dir="$STATE/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
		-master.port="$master" -volume.port="$volume" -filer.port="$filer" \
		-s3 -s3.port="$s3" -s3.config="$STATE/s3.json" -s3.port.iceberg=0 -s3.port.lance=0 \
		-volume.max="${CONTEXT_SERVICE_SEAWEEDFS_VOLUMES:-5}" -master.resumeState=false \
		-master.volumeSizeLimitMB=64 \
		>>"$LOGFILE" 2>&1 </dev/null &
	echo $! >"$PIDFILE"
	for i in $(seq 120); do
		alive_or_starting || {
			tail -n 30 "$LOGFILE" >&2
			die "weed exited at start-up"
		}
		s3_ready "$s3" && break
		[ "$i" = 120 ] && {
			tail -n 30 "$LOGFILE" >&2
			die "the S3 port $s3 did not answer within 60 s"
		}
		sleep 0.5
	done
	# The gateway answers before the filer has volumes to write to: retry the
	# bucket creation until it succeeds (or the bucket is there, after `stop`).
	for i in $(seq 60); do
		if s3_curl -f -X PUT "http://127.0.0.1:$s3/$BUCKET" -o /dev/null 2>/dev/null ||
			s3_curl -f -I "http://127.0.0.1:$s3/$BUCKET" -o /dev/null 2>/dev/null; then
			break
		fi
		[ "$i" = 60 ] && {
			tail -n 30 "$LOGFILE" >&2
			die "creating bucket $BUCKET failed"
		}
		sleep 0.5
	done
	# Ready means writable: the first write waits for the volume server to
	# register and a volume to grow (seconds; longer after a restart).
	for i in $(seq 60); do
		if s3_curl -f -X PUT -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" --data-binary ready \
			-m 30 "http://127.0.0.1:$s3/$BUCKET/.ready-probe" -o /dev/null 2>/dev/null; then
			s3_curl -X DELETE "http://127.0.0.1:$s3/$BUCKET/.ready-probe" -o /dev/null 2>/dev/null || true
			log "S3 on 127.0.0.1:$s3, bucket $BUCKET"
			return 0
		fi
		sleep 0.5
	done
	tail -n 30 "$LOGFILE" >&2
	die "the S3 server does not accept writes"
}

cmd_stop() {
	local pid i
	if pid_alive; then
		pid=$(cat "$PIDFILE")
		# weed's graceful stop takes ~11 s; an outage need not be graceful
		# (what it acknowledged is in its volume files already).
		kill "$pid" 2>/dev/null || true
		for i in $(seq 100); do
			pid_alive || break
			[ "$i" = 20 ] && kill -9 "$pid" 2>/dev/null
			sleep 0.1
		done
	fi
	rm -f "$PIDFILE"
}

cmd_down() {
	cmd_stop
	# weed leaves unix sockets named by port in /tmp: remove ours.
	local p
	if [ -f "$STATE/ports" ] && [ -f "$STATE/s3.port" ]; then
		for p in $(cat "$STATE/s3.port" "$STATE/ports"); do
			rm -f /tmp/seaweedfs-*-"$p".sock /tmp/seaweedfs-*-$((p + 10000)).sock
		done
	fi
	rm -rf "$STATE"
}

cmd_status() {
	if pid_alive; then
		echo "weed: running (pid $(cat "$PIDFILE")), S3 on 127.0.0.1:$(cat "$STATE/s3.port")"
	else
		echo "down"
		return 1
	fi
}

cmd_env() {
	pid_alive || die "SeaweedFS is not up; run '$0 up'"
	cat "$ENVFILE"
	# For tests that stop and restart the server (tests/scale/).
	echo "export CONTEXT_SERVICE_SEAWEEDFS_PID=$(cat "$PIDFILE")"
	echo "export CONTEXT_SERVICE_SEAWEEDFS_BIN=$BIN/weed"
	echo "export CONTEXT_SERVICE_SEAWEEDFS_STATE=$STATE"
}

case "${1:-}" in
build) cmd_build ;;
up) cmd_up ;;
stop) cmd_stop ;;
down) cmd_down ;;
status) cmd_status ;;
env) cmd_env ;;
*)
	echo "usage: $0 build|up|stop|down|status|env" >&2
	exit 2
	;;
esac
