# The job in the debian12-systemd VM (xtask/src/vm/systemd.rs), run from the control share
# by the image's codecage-vm-job.service under systemd. The same contract with the host as
# guest-init.sh (config, cmd.sh, started, rc, the output port), with systemd as pid 1: the
# job waits until systemd has finished starting up, runs under coreutils' timeout, and the
# machine powers off through systemd when it is done.
ctl=/run/codecage-ctl
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

say() { echo "systemd-job: $*" >/dev/console; }
die() {
	say "$*"
	sync
	systemctl poweroff -ff
	exit 1
}

. $ctl/config || die "cannot read config"
mkdir -p "$SHARE" || die "cannot create $SHARE"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose codecage.share "$SHARE" ||
	die "cannot mount the share at $SHARE"
out=
for p in /sys/class/virtio-ports/*; do
	[ "$(cat "$p/name" 2>/dev/null)" = "$OUT_PORT" ] && out=/dev/${p##*/}
done
[ -n "$out" ] && [ -c "$out" ] || die "virtio-serial port $OUT_PORT not found"

# The end of startup: "running", or "degraded" when a unit failed (the job says which).
timeout 300 systemctl is-system-running --wait >/dev/null 2>&1
echo started >$ctl/started
timeout -k 10 "$TIMEOUT" /bin/sh $ctl/cmd.sh </dev/null >"$out" 2>&1
rc=$?
if [ "$rc" = 124 ]; then
	echo "codecage-vm: command timed out after ${TIMEOUT}s" >"$out"
fi
echo "$rc" >$ctl/rc
sync
umount "$SHARE" 2>/dev/null
systemctl poweroff -ff
