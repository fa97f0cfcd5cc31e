# The guest's real init, run by /sbin/codecage-vm-init as PID 1 from the
# control share (/run/codecage-ctl). Busybox ash; only busybox applets until
# the job starts, because each dynamically linked exec costs 0.1-0.2 s under
# TCG.
#
# Contract with the host (xtask/src/vm/run.rs), all files in the control share:
#   config    sourced here: SHARE (absolute path), TIMEOUT (seconds, command
#             only), OUT_PORT (virtio-serial port name), CGROUP (v2 or v1: the
#             layout to mount, see below)
#   cmd.sh    the job: exports plus `cd` and `exec` of the command
#   started   written here right before the job starts: from then on the host
#             must not boot again (the job must never run twice)
#   rc        the job's exit status (124 when the guest watchdog fired)
# The job's stdout+stderr go to the virtio-serial port; this script's own
# messages go to the serial console, which the host shows only on failure.
bb=/bin/busybox
ctl=/run/codecage-ctl
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

say() { echo "guest-init: $*" >/dev/console; }
# With CODECAGE_VM_DEBUG set on the host, stage timestamps go to the console.
stamp() { [ -n "${DEBUG:-}" ] && read -r up _ </proc/uptime && say "$up s: $*"; }
die() {
	say "$*"
	$bb sync
	$bb poweroff -f
}

. $ctl/config || die "cannot read config"
stamp "init started"

# --- the usual early mounts (what systemd would do) ---------------------
$bb mount -t sysfs -o nosuid,nodev,noexec sysfs /sys
$bb mkdir -p /dev/pts /dev/shm
$bb mount -t devpts -o nosuid,noexec,gid=5,mode=620,ptmxmode=000 devpts /dev/pts
$bb mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm
$bb ln -sfn /proc/self/fd /dev/fd
$bb ln -sfn /proc/self/fd/0 /dev/stdin
$bb ln -sfn /proc/self/fd/1 /dev/stdout
$bb ln -sfn /proc/self/fd/2 /dev/stderr
$bb mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /tmp
$bb mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
$bb mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null

# --- the cgroup layout ------------------------------------------------------
# The job runs in a cgroup called vmjob, like a systemd service or a CI job's
# scope: the code under test starts as a process inside a non-root cgroup.
if [ "${CGROUP:-v2}" = v2 ]; then
	# Pure cgroup v2, as on a systemd host. nsdelegate: cgroup namespaces are
	# delegation boundaries (what systemd mounts with); memory_recursiveprot:
	# systemd's default too (the kernel ignores it before 5.7).
	$bb mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup ||
		$bb mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate cgroup2 /sys/fs/cgroup ||
		die "cannot mount cgroup2"
	echo "+cpu +cpuset +io +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control ||
		die "cannot enable controllers at the root"
	# vmjob has the controllers available but none enabled for its children,
	# so the code under test must obey the "no internal processes" rule (move
	# itself to a leaf before enabling any).
	jobdirs=/sys/fs/cgroup/vmjob
elif [ "$CGROUP" = v1 ]; then
	# Pure cgroup v1, as systemd's legacy mode mounts it (RHEL 8 and older): a
	# tmpfs, one hierarchy per controller (cpu+cpuacct and net_cls+net_prio
	# joined, with the usual symlinks), a named systemd hierarchy, and no
	# cgroup2 anywhere. The kernel runs without cgroup_no_v1.
	$bb mount -t tmpfs -o nosuid,nodev,noexec,mode=755 tmpfs /sys/fs/cgroup || die "cannot mount /sys/fs/cgroup"
	hierarchies=
	# A controller the kernel offers only on v2 (Linux 6.12 builds without
	# CONFIG_CPUSETS_V1 or CONFIG_MEMCG_V1) is left out, as systemd does; the
	# tests and vm-check then say what is missing.
	v1mount() { # v1mount DIR OPTIONS
		$bb mkdir -p "/sys/fs/cgroup/$1"
		if $bb mount -t cgroup -o "nosuid,nodev,noexec,$2" cgroup "/sys/fs/cgroup/$1"; then
			hierarchies="$hierarchies $1"
		else
			say "no v1 hierarchy $2 on this kernel"
			$bb rmdir "/sys/fs/cgroup/$1"
			return 1
		fi
	}
	v1mount systemd none,name=systemd || die "cannot mount the named systemd hierarchy"
	# /proc/cgroups: name, hierarchy, cgroups, enabled.
	while read -r name _ _ enabled; do
		case "$name" in '#'* | cpuacct | net_prio) continue ;; esac
		[ "$enabled" = 1 ] || continue
		case "$name" in
		cpu) v1mount cpu,cpuacct cpu,cpuacct && $bb ln -s cpu,cpuacct /sys/fs/cgroup/cpu &&
			$bb ln -s cpu,cpuacct /sys/fs/cgroup/cpuacct ;;
		net_cls) v1mount net_cls,net_prio net_cls,net_prio && $bb ln -s net_cls,net_prio /sys/fs/cgroup/net_cls &&
			$bb ln -s net_cls,net_prio /sys/fs/cgroup/net_prio ;;
		*) v1mount "$name" "$name" ;;
		esac
	done </proc/cgroups
	# The job in vmjob of every hierarchy but cpuset, whose new cgroups have no
	# CPUs until given some (systemd leaves units in its root too).
	jobdirs=
	for h in $hierarchies; do
		[ "$h" = cpuset ] || jobdirs="$jobdirs /sys/fs/cgroup/$h/vmjob"
	done
else
	die "unknown cgroup layout CGROUP=$CGROUP"
fi
for d in $jobdirs; do
	$bb mkdir "$d" || die "cannot create $d"
done
# kill_job: SIGKILL every process of the job's cgroup, and of the cgroups below
# it. cgroup.kill (Linux 5.14+) does it at once on v2; elsewhere the cgroup is
# frozen (cgroup.freeze on v2 from 5.2, the v1 freezer), every process in it
# killed, and thawed, a few rounds for the ones that were forking.
killer=${jobdirs# }
killer=${killer%% *}
[ "$CGROUP" = v1 ] && [ -d /sys/fs/cgroup/freezer/vmjob ] && killer=/sys/fs/cgroup/freezer/vmjob
freeze() { # freeze 1|0
	if [ -e "$killer/cgroup.freeze" ]; then
		echo "$1" >"$killer/cgroup.freeze"
	elif [ -e "$killer/freezer.state" ]; then
		if [ "$1" = 1 ]; then echo FROZEN; else echo THAWED; fi >"$killer/freezer.state"
	fi
}
kill_job() {
	if [ -e "$killer/cgroup.kill" ]; then
		echo 1 >"$killer/cgroup.kill"
		return
	fi
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		freeze 1
		pids=$($bb cat $($bb find "$killer" -name cgroup.procs))
		[ -n "$pids" ] && $bb kill -9 $pids
		freeze 0
		[ -z "$pids" ] && return
		$bb usleep 100000
	done
}

$bb hostname vm
$bb ip link set lo up 2>/dev/null || $bb ifconfig lo 127.0.0.1 up

# --- the project share, at the same absolute path as on the host ---------
$bb mkdir -p "$SHARE" || die "cannot create $SHARE"
$bb mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose codecage.share "$SHARE" ||
	die "cannot mount the share at $SHARE"

# --- the output port ------------------------------------------------------
out=
for p in /sys/class/virtio-ports/*; do
	[ "$($bb cat "$p/name" 2>/dev/null)" = "$OUT_PORT" ] && out=/dev/${p##*/}
done
[ -n "$out" ] && [ -c "$out" ] || die "virtio-serial port $OUT_PORT not found"

# --- run the job ----------------------------------------------------------
stamp "starting the job"
echo started >$ctl/started
# Watchdog in the root cgroup: after TIMEOUT s kill the whole job cgroup
# (kill_job reaches every descendant, including sub-cgroups the job made).
(
	$bb sleep "$TIMEOUT"
	echo "$TIMEOUT" >/run/timed-out
	kill_job
) &
watchdog=$!
# Writing 0 to cgroup.procs moves the writer itself: the subshell joins the
# job cgroup (in every v1 hierarchy), then becomes the job. Only the job's own
# tree is in there.
# The job runs under /bin/sh (dash), not busybox: Debian's busybox shell
# prefers its own applets over $PATH, so `sh`, `ls`, `ps`... started from it
# would be busybox's instead of the real ones.
(
	for d in $jobdirs; do
		echo 0 >"$d/cgroup.procs" || exit 125
	done
	exec /bin/sh $ctl/cmd.sh
) </dev/null >"$out" 2>&1
rc=$?
stamp "job exited with $rc"
kill $watchdog 2>/dev/null
if [ -e /run/timed-out ]; then
	echo "codecage-vm: command timed out after ${TIMEOUT}s" >"$out"
	rc=124
fi
# Leftover background processes of the job must not outlive it.
kill_job 2>/dev/null
echo "$rc" >$ctl/rc
$bb sync
$bb umount "$SHARE" 2>/dev/null
$bb poweroff -f
