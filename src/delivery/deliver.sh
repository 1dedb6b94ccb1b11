# Context Service: deliver one frozen workload revision into this sandbox.
# Rendered by context_service::delivery; every value below was validated
# and single-quoted by the renderer. Protocol on stdout, one line each:
#   NEED <n>                  send exactly n bundle bytes on stdin (0: cache hit)
#   ERROR <code> <reason>     failed; exit status non-zero
#   {"path":...,"revision":...,"cached":...}   done
# stderr is for logs only.

root=@ROOT@
scope=@SCOPE@
workload=@WORKLOAD@
run=@RUN_ID@
rev=@REVISION@
digest=@BUNDLE_DIGEST@
size=@BUNDLE_BYTES@
inflated=@INFLATED_BYTES@
inflated_cap=@INFLATED_CAP@
min_space=@MIN_SPACE@
entries=@ENTRIES@
verify=@VERIFY@

LC_ALL=C
export LC_ALL
umask 022
# The bundle arrives on stdin and the exec never closes it: keep it on fd 3
# for the one `head -c` that reads it, so nothing else can block on it.
exec 3<&0 </dev/null

staging=

fail() {
	printf 'ERROR %s %s\n' "$1" "$2"
	printf 'context delivery: %s: %s\n' "$1" "$2" >&2
	exit 1
}

# free_bytes: bytes available to this user on the root's filesystem.
free_bytes() {
	_fs=$(stat -f -c '%a %S' "$root" 2>/dev/null) || return 1
	set -- $_fs
	[ $# -eq 2 ] || return 1
	printf '%s\n' $(($1 * $2))
}

# fail_io STDERR WHAT: a failed write, classified by the tool's message or,
# since busybox may say only "I/O error", by the space left.
fail_io() {
	printf 'context delivery: %s: %s\n' "$2" "$1" >&2
	case $1 in
	*"No space left"* | *"uota exceeded"*)
		fail disk_full "no space left on device while $2" ;;
	esac
	if _free=$(free_bytes) && [ "$_free" -lt 1048576 ]; then
		fail disk_full "no space left on device while $2"
	fi
	fail write_failed "$2 failed"
}

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

cleanup() {
	if [ -n "$staging" ]; then
		remove_tree "$staging" 2>/dev/null
	fi
}
trap cleanup EXIT
trap 'fail interrupted "delivery interrupted by a signal"' HUP INT TERM

for tool in head tee sha256sum gzip tar flock mkdir mv rm chmod stat ln; do
	command -v "$tool" >/dev/null 2>&1 || fail missing_tool "$tool not found on PATH"
done

# A relative root is taken in the working directory; the path printed at
# the end is absolute. $PWD must hold only characters the JSON line and the
# protocol can carry as they are.
case $root in
/*) ;;
*)
	case $PWD in
	/*) ;;
	*) fail bad_root "the working directory is unknown, so a relative root cannot be used" ;;
	esac
	case $PWD in
	*[!A-Za-z0-9._/-]*) fail bad_root "the working directory has characters a delivery path cannot hold" ;;
	esac
	root=${PWD%/}/$root
	;;
esac

mkdir -p "$root" 2>/dev/null
[ -d "$root" ] && [ -w "$root" ] || fail bad_root "cannot create or write the delivery root $root"
# A failed redirection on `exec` would end the shell without an ERROR line.
(printf '' >>"$root/.lock") 2>/dev/null || fail bad_root "cannot open $root/.lock"
exec 9>>"$root/.lock"
flock 9 || fail lock_failed "cannot lock $root/.lock"

# --- the cache-dir scan ---------------------------------------------------
# A scan prints a deterministic description of a tree; its sha256 is the
# manifest. `layout`: every entry's kind and name, and mode and size of every
# file; `content`: kinds and names, and the sha256 of every file. Names are
# length-prefixed so no name can mimic another line. File arguments are
# collected single-quoted in $acc and handed to one stat/sha256sum call per
# ~32 KiB of names, not one process per file. A new tree gets both in one
# walk (`both`: the layout on stdout, the content on fd 4).

acc=
count=0

quote_append() {
	_rest=$1
	_out=
	while :; do
		case $_rest in
		*\'*)
			_out="$_out${_rest%%\'*}'\\''"
			_rest=${_rest#*\'}
			;;
		*) break ;;
		esac
	done
	acc="$acc '$_out$_rest'"
}

flush() {
	[ -n "$acc" ] || return 0
	case $scan_mode in
	content) eval "sha256sum -- $acc" ;;
	layout) eval "stat -c '%f %s' -- $acc" ;;
	*) eval "stat -c '%f %s' -- $acc" && eval "sha256sum -- $acc" >&4 ;;
	esac
	_status=$?
	acc=
	return $_status
}

# entry KIND NAME: one entry's line, in both streams of a `both` scan.
entry() {
	count=$((count + 1))
	printf '%s %s:%s\n' "$1" "${#2}" "$2"
	if [ "$scan_mode" = both ]; then
		printf '%s %s:%s\n' "$1" "${#2}" "$2" >&4
	fi
}

# walk PREFIX: entries under PREFIX ("" or "dir/"), depth first, byte order.
# Recursion is the last statement of its iteration because $_e is global.
walk() {
	for _e in "$1"* "$1".[!.]* "$1"..?*; do
		if [ -L "$_e" ]; then
			entry l "$_e"
		elif [ -d "$_e" ]; then
			entry d "$_e"
			walk "$_e/" || return 1
		elif [ -e "$_e" ]; then
			entry f "$_e"
			quote_append "$_e"
			if [ ${#acc} -ge 32768 ]; then
				flush || return 1
			fi
		fi
	done
}

# scan MODE DIR [COUNT-FILE]: prints the sha256 of the scan of DIR.
scan() {
	_sum=$(
		(
			cd "$2" || exit 1
			scan_mode=$1
			walk "" && flush || exit 1
			if [ -n "$3" ]; then
				printf '%s\n' "$count" >"$3" || exit 1
			fi
		) 9>&- | sha256sum
	) || return 1
	printf '%s\n' "${_sum%% *}"
}

# scan_both DIR COUNT-FILE CONTENT-FILE: one walk for both manifests of a new
# tree; prints the layout's sha256 and leaves the content's sha256 (with the
# file name sha256sum adds) in CONTENT-FILE. COUNT-FILE is written only when
# the walk succeeded.
scan_both() {
	_sum=$(
		{
			(
				cd "$1" || exit 1
				scan_mode=both
				walk "" && flush || exit 1
				printf '%s\n' "$count" >"$2" || exit 1
			) 4>&1 >&5 | sha256sum >"$3"
		} 5>&1 9>&- | sha256sum
	) || return 1
	printf '%s\n' "${_sum%% *}"
}

# check_cache: is the published dir intact? Sets $why when not.
check_cache() {
	why="its manifest is missing"
	read -r _want <"$cdir/layout" || return 1
	why="its layout (paths, kinds, modes, sizes) changed"
	_got=$(scan layout "$cdir/tree") || return 1
	[ "$_got" = "$_want" ] || return 1
	[ "$verify" = full ] || return 0
	why="its content manifest is missing"
	read -r _want <"$cdir/content" || return 1
	why="the content of a file changed"
	_got=$(scan content "$cdir/tree") || return 1
	[ "$_got" = "$_want" ]
}

# --- under the lock from here on ---------------------------------------

mkdir -p "$root/cache" "$root/refs" "$root/runs" || fail write_failed "cannot create the cache layout under $root"

# Only a crashed run can have left staging dirs: live ones need the lock.
for stale in "$root"/cache/.staging.*; do
	if [ -e "$stale" ]; then
		remove_tree "$stale" || fail write_failed "cannot remove the stale staging dir $stale"
	fi
done

key=$scope-$rev
cdir=$root/cache/$key
ref=$root/refs/$key/$workload/$run
view=$root/runs/$scope/$workload/$run

# A run is registered once, with one revision.
for other in "$root"/refs/"$scope"-*/"$workload"/"$run"; do
	if [ -e "$other" ] && [ "$other" != "$ref" ]; then
		fail run_conflict "run $run of workload $workload is registered with another revision"
	fi
done

cached=false
if [ -d "$cdir" ] && [ ! -L "$cdir" ]; then
	if check_cache; then
		cached=true
	else
		printf 'context delivery: cache dir %s failed verification: %s; delivering it again\n' "$key" "$why" >&2
		remove_tree "$cdir" || fail write_failed "cannot remove the damaged cache dir $key"
	fi
elif [ -e "$cdir" ] || [ -L "$cdir" ]; then
	remove_tree "$cdir" || fail write_failed "cannot remove the damaged cache dir $key"
fi

if [ "$cached" = true ]; then
	printf 'NEED 0\n'
else
	# The bundle and its tar sit side by side for a while: refuse early,
	# before any byte is sent, when that cannot fit.
	if free=$(free_bytes) && [ "$free" -lt "$min_space" ]; then
		fail disk_full "the delivery needs at least $min_space bytes, $free are available under $root"
	fi
	printf 'NEED %s\n' "$size"
	staging=$root/cache/.staging.$$
	mkdir "$staging" "$staging/tree" || fail write_failed "cannot create the staging dir"

	# Receiving, hashing and inflating overlap. Exactly $size bytes: the
	# exec's stdin is never closed, so never read to EOF. `tee` keeps the
	# bytes and feeds gzip as they arrive; once all are on disk they are
	# hashed while gzip is still inflating, and the tar is hashed as it is
	# written. Inflating bytes not yet verified is safe: gzip is made to
	# parse hostile input, and its output stops at the cap; `tar` reads
	# nothing before both digests matched, below. When gzip stops early (bad
	# bytes, the cap reached) the rest is drained, so every byte is still
	# received and the checks below, in order, say what was wrong. sh has no
	# pipefail: every failable stage records its status in a file.
	s=$staging
	err=$(
		{
			{
				head -c "$size" <&3 | tee "$s/bundle.gz"
				printf '%s\n' $? >"$s/received"
				sha256sum <"$s/bundle.gz" >"$s/bundle.gz.sum"
			} | {
				gzip -dc
				head -c "$size" >/dev/null
			} | head -c "$inflated_cap" | {
				tee "$s/bundle.tar"
				printf '%s\n' $? >"$s/inflated"
			} | sha256sum >"$s/bundle.tar.sum"
		} 2>&1 9>&-
	)
	exec 3<&-
	read -r st <"$s/received" && [ "$st" = 0 ] ||
		fail_io "$err" "receiving the bundle"
	got=$(stat -c %s "$s/bundle.gz") || fail write_failed "cannot stat the received bundle"
	[ "$got" = "$size" ] || fail short_transfer "received $got of $size bundle bytes"
	read -r sum _ <"$s/bundle.gz.sum" || fail write_failed "cannot hash the received bundle"
	[ "$sum" = "$digest" ] ||
		fail digest_mismatch "sha256 of the received bytes is not the bundle digest"
	rm -f "$s/bundle.gz" "$s/bundle.gz.sum" "$s/received"

	# Never inflated past the recorded size (+1 byte, to notice an overrun).
	got=$(stat -c %s "$s/bundle.tar") || fail write_failed "cannot stat the inflated bundle"
	[ "$got" -le "$inflated" ] ||
		fail too_large "the bundle inflates to more than the recorded $inflated bytes"
	read -r st <"$s/inflated" && [ "$st" = 0 ] ||
		fail_io "$err" "inflating the bundle"
	# The end-to-end pin: tar only ever parses the exact canonical archive,
	# whose entries and sizes the service counted at upload.
	read -r sum _ <"$s/bundle.tar.sum" || fail write_failed "cannot hash the inflated bundle"
	[ "$sum" = "$rev" ] ||
		fail revision_mismatch "sha256 of the inflated bundle is not the revision"
	rm -f "$s/bundle.tar.sum" "$s/inflated"

	# GNU tar knows the long options; busybox spells no-same-owner `-o`.
	case $(tar --version 2>/dev/null) in
	*GNU*) set -- --no-same-owner --no-same-permissions ;;
	*) set -- -o --no-same-permissions ;;
	esac
	err=$(tar -x "$@" -f "$staging/bundle.tar" -C "$staging/tree" 2>&1 9>&-) ||
		fail_io "$err" "extracting the bundle"
	rm -f "$staging/bundle.tar"

	# Read-only first: the manifest records the modes the runs will see.
	chmod -R a-w "$staging/tree" || fail write_failed "cannot make the tree read-only"
	lay=$(scan_both "$staging/tree" "$staging/count" "$staging/content.sum") ||
		fail write_failed "cannot record the manifest"
	read -r n <"$staging/count" || fail write_failed "cannot record the manifest"
	read -r con _ <"$staging/content.sum" || fail write_failed "cannot record the manifest"
	rm -f "$staging/count" "$staging/content.sum"
	[ "$n" -le "$entries" ] ||
		fail too_many_entries "the bundle has $n entries, more than the recorded $entries"
	[ "$n" -eq "$entries" ] ||
		fail extract_failed "extracted $n of $entries entries"
	err=$({ printf '%s\n' "$lay" >"$staging/layout" && printf '%s\n' "$con" >"$staging/content"; } 2>&1) ||
		fail_io "$err" "writing the manifest"
	chmod a-w "$staging" "$staging/layout" "$staging/content" ||
		fail write_failed "cannot make the cache dir read-only"
	if [ -e "$cdir" ] || [ -L "$cdir" ]; then
		fail write_failed "$cdir appeared while the lock was held"
	fi
	mv "$staging" "$cdir" || fail write_failed "cannot publish the cache dir"
	staging=
fi

# --- register the run --------------------------------------------------
mkdir -p "$root/refs/$key/$workload" "$root/runs/$scope/$workload" ||
	fail write_failed "cannot create the run's directories"
printf '' >>"$ref" || fail write_failed "cannot record the run's reference"
if [ -L "$view" ] || [ -e "$view" ]; then
	remove_tree "$view" || fail write_failed "cannot replace the run's view"
fi
ln -s "../../../cache/$key/tree" "$view" || fail write_failed "cannot create the run's view"
# A referenced revision is no longer a candidate for retention pruning.
rm -f "$root"/idle/"$scope"/*-"$rev"

printf '{"path":"%s","revision":"%s","cached":%s}\n' "$view" "$rev" "$cached"
