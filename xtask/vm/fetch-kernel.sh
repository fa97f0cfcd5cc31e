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
# $1: the chroot (mmdebstrap passes it)
# $2: directory to unpack the kernel package into
# $3: suite to take the kernel from; empty or the chroot's own suite for its
#     own kernel, e.g. bookworm-backports for a newer one
# $4: mirror URI for that suite (only used when it is another suite)
set -eu
root=$1
out=$2
ksuite=${3:-}
kmirror=${4:-http://deb.debian.org/debian}

own=$(. "$root/etc/os-release" && echo "${VERSION_CODENAME:-}")
aptopt=
extra=/etc/apt/sources.list.d/codecage-kernel.sources
if [ -n "$ksuite" ] && [ "$ksuite" != "$own" ]; then
	# Another suite (backports): add it for this download only, and make it
	# the default release so that its kernel is the candidate.
	printf '%s\n' "Types: deb" "URIs: $kmirror" "Suites: $ksuite" "Components: main" \
		"Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" >"$root$extra"
	chroot "$root" apt-get update -q
	aptopt="-o APT::Default-Release=$ksuite"
fi

# linux-image-amd64 is a metapackage; its first dependency names the real,
# versioned kernel package (e.g. linux-image-6.1.0-41-amd64).
# $aptopt is deliberately unquoted: two words or none.
pkg=$(chroot "$root" apt-cache $aptopt show --no-all-versions linux-image-amd64 |
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
chroot "$root" sh -c "cd $dl && apt-get $aptopt download -q '$pkg'"
mkdir -p "$out"
for deb in "$root$dl"/*.deb; do
	dpkg-deb -x "$deb" "$out"
done
rm -rf "$root$dl"
# The guest keeps only its own suite configured.
rm -f "$root$extra"
