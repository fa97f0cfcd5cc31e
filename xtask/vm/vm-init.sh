#!/bin/busybox sh
# /sbin/codecage-vm-init: PID 1 of the guest, baked into the image.
#
# Deliberately a stub: it mounts the per-run control share (9p tag
# codecage.ctl, a temp dir on the host) and runs the real init script from
# there. That script (xtask/vm/guest-init.sh) therefore can change without
# rebuilding the image.
bb=/bin/busybox
$bb mount -t proc proc /proc
$bb mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
$bb mkdir -p /run/codecage-ctl
if $bb mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 codecage.ctl /run/codecage-ctl &&
	[ -f /run/codecage-ctl/guest-init.sh ]; then
	exec $bb sh /run/codecage-ctl/guest-init.sh
fi
echo "codecage-vm-init: control share missing" >&2
$bb poweroff -f
