# Context Service: deliver one frozen workload revision into this sandbox.
# Rendered by context_service::delivery; every value below was validated
# and single-quoted by the renderer. Protocol on stdout, one line each:
#   RESEND <reason>           (optional, first) the cache dir failed its check
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
# The revision's tree manifest (see "the tree scan" below).
want_names=@NAMES_SHA@
want_modes=@MODES_SHA@
want_content=@CONTENT_SHA@

LC_ALL=C
export LC_ALL
umask 022
# The bundle arrives on stdin and the exec never closes it: keep it on fd 3
# for the one `head -c` that reads it, so nothing else can block on it.
exec 3<&0 </dev/null

staging=
scanp=

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
	if [ -n "$scanp" ]; then
		rm -f "$scanp".* 2>/dev/null
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

# --- the tree scan ------------------------------------------------------
# A scan hashes three streams of a tree, each with one sha256sum, for the
# gateway's manifest of the revision (computed from the bundle by the
# service, `bundle::manifest`; it must match this byte for byte):
#   names    every entry's kind and path, length-prefixed so no name can
#            mimic a line: `d 3:dir`, `f 7:dir/a b`
#   modes    every file's `stat -c '%f %s'` (raw mode in hex, size)
#   content  every file's sha256 (only when asked: it reads the whole tree)
# in sh's glob order under LC_ALL=C, depth first. File arguments are
# collected single-quoted in $acc and handed to one stat/sha256sum call per
# ~32 KiB of names, not one process per file.

nl='
'
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

# flush: modes of the collected files on fd 4, their sha256 lines on fd 5.
flush() {
	[ -n "$acc" ] || return 0
	eval "stat -c '%f %s' -- $acc" >&4 || return 1
	if [ "$scan_verify" = full ]; then
		eval "sha256sum -- $acc" >&5 || return 1
	fi
	acc=
}

# walk PREFIX: entries under PREFIX ("" or "dir/"), depth first, byte order.
# Recursion is the last statement of its iteration because $_e is global.
walk() {
	for _e in "$1"* "$1".[!.]* "$1"..?*; do
		if [ -L "$_e" ]; then
			count=$((count + 1))
			printf 'l %s:%s\n' "${#_e}" "$_e"
		elif [ -d "$_e" ]; then
			count=$((count + 1))
			printf 'd %s:%s\n' "${#_e}" "$_e"
			walk "$_e/" || return 1
		elif [ -e "$_e" ]; then
			count=$((count + 1))
			printf 'f %s:%s\n' "${#_e}" "$_e"
			case $_e in
			*"$nl"*)
				# sha256sum would print this name over two lines: keep the
				# order, and hash it on its own from stdin.
				flush || return 1
				quote_append "$_e"
				eval "stat -c '%f %s' -- $acc" >&4 || return 1
				acc=
				if [ "$scan_verify" = full ]; then
					sha256sum <"$_e" >&5 || return 1
				fi
				;;
			*)
				quote_append "$_e"
				if [ ${#acc} -ge 32768 ]; then
					flush || return 1
				fi
				;;
			esac
		fi
	done
}

# hashes_only: sha256sum's lines without the names (GNU prefixes a line
# with a backslash when it escapes a name).
hashes_only() {
	while read -r _h _; do
		printf '%s\n' "${_h#\\}"
	done
}

# scan DIR default|full: scans DIR (full: with content) into $scanp.names,
# .modes, .content (sha256sum lines) and .count (written last, only when
# the walk succeeded).
scan() {
	rm -f "$scanp".*
	{
		{
			{
				(
					cd "$1" || exit 1
					scan_verify=$2
					walk "" && flush || exit 1
					printf '%s\n' "$count" >"$scanp.count" || exit 1
				) 4>&1 >&6 5>&7 | sha256sum >"$scanp.modes"
			} 7>&1 | hashes_only | sha256sum >"$scanp.content"
		} 6>&1 | sha256sum >"$scanp.names"
	} 9>&-
}

# tree_matches DIR default|full: does DIR match the revision's manifest? Sets
# $scanned (entries seen, or empty) and $why when not.
tree_matches() {
	scanned=
	why="its tree is not a directory"
	[ -d "$1" ] && [ ! -L "$1" ] || return 1
	why="the tree could not be scanned"
	scan "$1" "$2"
	read -r scanned <"$scanp.count" &&
		read -r _names _ <"$scanp.names" &&
		read -r _modes _ <"$scanp.modes" &&
		read -r _content _ <"$scanp.content"
	_read=$?
	rm -f "$scanp".*
	[ "$_read" = 0 ] || { scanned=; return 1; }
	why="it has $scanned entries, the revision has $entries"
	[ "$scanned" = "$entries" ] || return 1
	why="its paths or entry kinds differ"
	[ "$_names" = "$want_names" ] || return 1
	why="its file modes or sizes differ"
	[ "$_modes" = "$want_modes" ] || return 1
	[ "$2" = full ] || return 0
	why="the content of a file differs"
	[ "$_content" = "$want_content" ]
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
# Scan results, named so a crashed run's are removed with stale staging.
scanp=$root/cache/.staging.$$.scan
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
	if tree_matches "$cdir/tree" "$verify"; then
		cached=true
	else
		printf 'RESEND the cache dir failed verification: %s\n' "$why"
		printf 'context delivery: cache dir %s failed verification: %s; delivering it again\n' "$key" "$why" >&2
		remove_tree "$cdir" || fail write_failed "cannot remove the damaged cache dir $key"
	fi
elif [ -e "$cdir" ] || [ -L "$cdir" ]; then
	printf 'RESEND the cache dir is not a directory\n'
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

	# Read-only first: the manifest has the modes the runs will see. The
	# tar was the pinned one, so the content needs no second read; the
	# layout (cheap: no file is read) proves tar made every entry as it is.
	chmod -R a-w "$staging/tree" || fail write_failed "cannot make the tree read-only"
	if ! tree_matches "$staging/tree" default; then
		[ -n "$scanned" ] || fail write_failed "cannot scan the extracted tree"
		[ "$scanned" -le "$entries" ] ||
			fail too_many_entries "the bundle has $scanned entries, more than the recorded $entries"
		[ "$scanned" -eq "$entries" ] ||
			fail extract_failed "extracted $scanned of $entries entries"
		fail extract_failed "the extracted tree does not match the revision's manifest: $why"
	fi
	chmod a-w "$staging" || fail write_failed "cannot make the cache dir read-only"
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
