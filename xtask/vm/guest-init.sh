# The guest's real init, run by /sbin/codecage-vm-init as PID 1 from the
# control share (/run/codecage-ctl). Busybox ash; only busybox applets until
# the job starts, because each dynamically linked exec costs 0.1-0.2 s under
# TCG.
#
# Contract with the host (xtask/src/vm/run.rs), all files in the control share:
#   config    sourced here: SHARE (absolute path), TIMEOUT (seconds, command
#             only), OUT_PORT (virtio-serial port name)
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

# --- pure cgroup v2, as on a systemd host ---------------------------------
# nsdelegate: cgroup namespaces are delegation boundaries (what systemd mounts
# with); memory_recursiveprot: systemd's default too.
$bb mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup ||
	die "cannot mount cgroup2"
echo "+cpu +cpuset +io +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control ||
	die "cannot enable controllers at the root"
# The job's cgroup, like a systemd service or a CI job's scope: the code under
# test starts as a process inside a non-root cgroup that has the controllers
# available but none enabled for its children, so it must obey the "no
# internal processes" rule (move itself to a leaf before enabling any).
job=/sys/fs/cgroup/vmjob
$bb mkdir $job || die "cannot create $job"

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
# (cgroup.kill reaches every descendant, including sub-cgroups the job made).
(
	$bb sleep "$TIMEOUT"
	echo "$TIMEOUT" >/run/timed-out
	echo 1 >$job/cgroup.kill
) &
watchdog=$!
# Writing 0 to cgroup.procs moves the writer itself: the subshell joins the
# job cgroup, then becomes the job. Only the job's own tree is in there.
# The job runs under /bin/sh (dash), not busybox: Debian's busybox shell
# prefers its own applets over $PATH, so `sh`, `ls`, `ps`... started from it
# would be busybox's instead of the real ones.
(
	echo 0 >$job/cgroup.procs || exit 125
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
echo 1 >$job/cgroup.kill 2>/dev/null
echo "$rc" >$ctl/rc
$bb sync
$bb umount "$SHARE" 2>/dev/null
$bb poweroff -f
