# Context Service: release one run's view of a delivered revision.
# Rendered by context_service::delivery; every value below was validated
# and single-quoted by the renderer. Protocol on stdout, one line:
#   {"released":true|false}   (false: no such run)
#   ERROR <code> <reason>     failed; exit status non-zero
# stderr is for logs only. Idempotent.

root=@ROOT@
scope=@SCOPE@
workload=@WORKLOAD@
run=@RUN_ID@
retention=@RETENTION@

LC_ALL=C
export LC_ALL
umask 022
exec </dev/null

fail() {
	printf 'ERROR %s %s\n' "$1" "$2"
	printf 'context release: %s: %s\n' "$1" "$2" >&2
	exit 1
}
trap 'fail interrupted "release interrupted by a signal"' HUP INT TERM

# Read-only trees cannot be removed until they are writable again; a
# symlink is removed itself, never followed.
remove_tree() {
	if [ -L "$1" ]; then
		rm -f "$1"
	else
		chmod -R u+w "$1" 2>/dev/null
		rm -rf "$1"
	fi
}

# remove_if_empty DIR: drops a bookkeeping dir once nothing is left in it.
remove_if_empty() {
	for _x in "$1"/* "$1"/.[!.]* "$1"/..?*; do
		if [ -e "$_x" ] || [ -L "$_x" ]; then
			return 0
		fi
	done
	rm -rf "$1"
}

# referenced KEY: does any run still hold KEY?
referenced() {
	for _r in "$root"/refs/"$1"/*/*; do
		if [ -e "$_r" ]; then
			return 0
		fi
	done
	return 1
}

for tool in flock mkdir rm chmod; do
	command -v "$tool" >/dev/null 2>&1 || fail missing_tool "$tool not found on PATH"
done

if [ ! -d "$root" ]; then
	printf '{"released":false}\n'
	exit 0
fi
(printf '' >>"$root/.lock") 2>/dev/null || fail bad_root "cannot open $root/.lock"
exec 9>>"$root/.lock"
flock 9 || fail lock_failed "cannot lock $root/.lock"

view=$root/runs/$scope/$workload/$run
released=false
keys=
for ref in "$root"/refs/"$scope"-*/"$workload"/"$run"; do
	[ -e "$ref" ] || continue
	key=${ref#"$root/refs/"}
	key=${key%%/*}
	rm -f "$ref" || fail write_failed "cannot remove the run's reference"
	remove_if_empty "$root/refs/$key/$workload"
	keys="$keys $key"
	released=true
done
if [ -L "$view" ] || [ -e "$view" ]; then
	remove_tree "$view" || fail write_failed "cannot remove the run's view"
	remove_if_empty "$root/runs/$scope/$workload"
	remove_if_empty "$root/runs/$scope"
	released=true
fi

# Revisions nobody references any more: removed now (retention 0) or queued
# as idle, oldest first, in a counter-named marker (no `ls -t` needed).
for key in $keys; do
	referenced "$key" && continue
	rm -rf "$root/refs/$key"
	if [ "$retention" -eq 0 ]; then
		remove_tree "$root/cache/$key" || fail write_failed "cannot remove the cache dir $key"
	else
		mkdir -p "$root/idle/$scope" || fail write_failed "cannot record an idle revision"
		seq=0
		if [ -f "$root/idle/.seq" ]; then
			read -r seq <"$root/idle/.seq"
		fi
		case $seq in '' | *[!0-9]*) seq=0 ;; esac
		seq=$((seq + 1))
		printf '%s\n' "$seq" >"$root/idle/.seq" || fail write_failed "cannot record an idle revision"
		rm -f "$root"/idle/"$scope"/*-"${key#"$scope"-}"
		printf '' >"$root/idle/$scope/$(printf '%020d' "$seq")-${key#"$scope"-}" ||
			fail write_failed "cannot record an idle revision"
	fi
done

# Keep only the $retention most recently unreferenced revisions of the scope.
idle=0
for marker in "$root"/idle/"$scope"/*; do
	[ -e "$marker" ] && idle=$((idle + 1))
done
excess=$((idle - retention))
for marker in "$root"/idle/"$scope"/*; do
	[ "$excess" -gt 0 ] || break
	[ -e "$marker" ] || continue
	key=$scope-${marker##*-}
	if ! referenced "$key"; then
		remove_tree "$root/cache/$key" || fail write_failed "cannot remove the cache dir $key"
	fi
	rm -f "$marker"
	excess=$((excess - 1))
done

printf '{"released":%s}\n' "$released"
