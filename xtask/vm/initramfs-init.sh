#!/bin/busybox sh
# /init of the VM's initramfs. The Debian kernel builds virtio, ext4 and 9p as
# modules, so this tiny stage loads them (list in /modules, in dependency
# order, computed at build time with `modprobe --show-depends`), mounts the
# ext4 root disk and switches to it. Only busybox applets: no dynamic linking.
/bin/busybox --install -s /bin
export PATH=/bin

fail() {
	echo "initramfs: $*" >&2
	# No shell to fall back to: power off so the host sees the failure now
	# (and may retry the boot) instead of waiting for its timeout.
	poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null

# A failed insmod is not fatal: some modules are CPU-specific accelerations
# (crc32c-intel needs SSE4.2, absent with e.g. `-cpu qemu64`). If an essential
# one is missing, the root mount below fails and says so.
while read -r m; do
	insmod "/lib/modules/$m" || echo "initramfs: insmod $m failed, continuing" >&2
done </modules

# virtio-blk probes asynchronously; give it a moment.
i=0
while [ ! -b /dev/vda ]; do
	i=$((i + 1))
	[ $i -gt 100 ] && fail "no /dev/vda after 5 s"
	usleep 50000
done

# noinit_itable: no background zeroing of inode tables (ext4lazyinit) in a
# throw-away snapshot; it would only cost CPU under TCG.
mount -t ext4 -o rw,noatime,noinit_itable /dev/vda /newroot || fail "cannot mount /dev/vda"
mount --move /dev /newroot/dev
umount /sys /proc
exec switch_root /newroot /sbin/codecage-vm-init
