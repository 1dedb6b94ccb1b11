# Context Service: deliver with the injected agent when it can run here,
# else with the script that follows this part. Rendered by
# context_service::delivery like the script; every value was validated and
# single-quoted. Protocol lines on stdout before the script's or the
# agent's own:
#   AGENT <arch>              send exactly the gateway's agent for <arch>
#   TRANSPORT agent|script    which of the two delivers
# stdin is left untouched unless AGENT was printed; then exactly the
# agent's size is read from it, so the bundle bytes that follow stay whole.

agent_root=@ROOT@
agent_x86_64=@AGENT_X86_64_SHA@
agent_x86_64_bytes=@AGENT_X86_64_BYTES@
agent_aarch64=@AGENT_AARCH64_SHA@
agent_aarch64_bytes=@AGENT_AARCH64_BYTES@

# agent_verified FILE: a regular file whose sha256 is the agent's.
agent_verified() {
	[ -f "$1" ] && [ ! -L "$1" ] || return 1
	agent_sum=$(sha256sum <"$1" 2>/dev/null) || return 1
	[ "${agent_sum%% *}" = "$agent_sha" ]
}

# agent_try: returns when the script must deliver; execs the agent otherwise.
agent_try() {
	case $(uname -m 2>/dev/null </dev/null) in
	x86_64 | amd64) agent_arch=x86_64 agent_sha=$agent_x86_64 agent_bytes=$agent_x86_64_bytes ;;
	aarch64 | arm64) agent_arch=aarch64 agent_sha=$agent_aarch64 agent_bytes=$agent_aarch64_bytes ;;
	*) return 0 ;;
	esac
	[ -n "$agent_sha" ] || return 0
	for agent_tool in sha256sum head chmod mkdir mv rm cat; do
		command -v "$agent_tool" >/dev/null 2>&1 || return 0
	done
	# The same resolution of a relative root as the script's (which
	# refuses a working directory it cannot use; so does this part).
	case $agent_root in
	/*) ;;
	*)
		case $PWD in /*) ;; *) return 0 ;; esac
		case $PWD in *[!A-Za-z0-9._/-]*) return 0 ;; esac
		agent_root=${PWD%/}/$agent_root
		;;
	esac
	agent_bin=$agent_root/bin/$agent_sha/context-agent
	if ! agent_verified "$agent_bin"; then
		mkdir -p "$agent_root/bin" 2>/dev/null || return 0
		agent_tmp=$agent_root/bin/.incoming.$$
		printf 'AGENT %s\n' "$agent_arch"
		# Exactly the agent's bytes, even when keeping them fails: the
		# bundle follows on the same stdin.
		head -c "$agent_bytes" | {
			cat >"$agent_tmp" 2>/dev/null
			agent_st=$?
			cat >/dev/null
			exit "$agent_st"
		}
		agent_st=$?
		# Checked before it is made executable; a bad copy is dropped.
		if [ "$agent_st" != 0 ] || ! agent_verified "$agent_tmp"; then
			printf 'context delivery: the agent did not arrive intact; using the script\n' >&2
			rm -f "$agent_tmp"
			return 0
		fi
		if ! { chmod 0555 "$agent_tmp" && mkdir -p "${agent_bin%/*}" &&
			mv -f "$agent_tmp" "$agent_bin"; } 2>/dev/null; then
			rm -f "$agent_tmp"
			return 0
		fi
	fi
	# A noexec root (126) or a binary this kernel cannot run falls back.
	"$agent_bin" probe >/dev/null 2>&1 </dev/null
	agent_st=$?
	if [ "$agent_st" != 0 ]; then
		printf 'context delivery: the agent cannot run here (exit %s); using the script\n' "$agent_st" >&2
		return 0
	fi
	printf 'TRANSPORT agent\n'
	exec "$agent_bin" deliver root="$agent_root" scope=@SCOPE@ workload=@WORKLOAD@ \
		run=@RUN_ID@ revision=@REVISION@ digest=@BUNDLE_DIGEST@ size=@BUNDLE_BYTES@ \
		inflated=@INFLATED_BYTES@ entries=@ENTRIES@ verify=@VERIFY@ \
		names=@NAMES_SHA@ modes=@MODES_SHA@ content=@CONTENT_SHA@
}
agent_try
printf 'TRANSPORT script\n'

