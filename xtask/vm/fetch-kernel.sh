#!/bin/sh
# mmdebstrap --customize-hook: fetch the guest kernel package with the chroot's
# own apt (so its Debian sources and keys are used, even on a non-Debian host)
# and unpack it OUTSIDE the chroot.
#
# Why not `--include=linux-image-amd64`: installing the kernel runs its
# postinst (initramfs-tools, hooks touching /boot), which we do not want; we
# only need the files. Why unpack outside: the unpacked tree (~400 MB of
# modules) must not end up in the guest image whole, and mmdebstrap empties
# the chroot's /tmp during its cleanup, so nothing may be left there.
#
# $1: the chroot (mmdebstrap passes it), $2: directory to unpack the kernel into.
set -eu
root=$1
out=$2

# linux-image-amd64 is a metapackage; its first dependency names the real,
# versioned kernel package (e.g. linux-image-6.1.0-41-amd64).
pkg=$(chroot "$root" apt-cache show --no-all-versions linux-image-amd64 |
	sed -n 's/^Depends: *\(linux-image-[^ ,|]*\).*/\1/p' | head -n 1)
if [ -z "$pkg" ]; then
	echo "fetch-kernel: cannot resolve linux-image-amd64 to a kernel package" >&2
	exit 1
fi
echo "fetch-kernel: $pkg"

dl=/var/tmp/codecage-kernel-dl
rm -rf "$root$dl"
mkdir -p "$root$dl"
# apt downloads as the _apt user when it can; let it write there.
chown _apt "$root$dl" 2>/dev/null || true
chroot "$root" sh -c "cd $dl && apt-get download -q '$pkg'"
mkdir -p "$out"
for deb in "$root$dl"/*.deb; do
	dpkg-deb -x "$deb" "$out"
done
rm -rf "$root$dl"
