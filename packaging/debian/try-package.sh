#!/bin/bash
# Installs, runs, upgrades and purges the package in a throwaway Debian 12 root, without
# touching the host: a private mount namespace (unshare -m) mounts an overlay whose lower
# layer is codecage's default image (a bookworm root with dpkg, built by `cargo xtask
# rootfs`) and whose upper layer is a temporary directory, and makes it its root.
#
#   packaging/debian/try-package.sh target/dist/codecage_VERSION_ARCH.deb
#
# Checks: dpkg -i succeeds and enables the unit (no systemd runs in that root, so the
# unit is not started: the maintainer scripts skip that when /run/systemd/system is
# absent); `codecage --version`, `codecage profiles` and `codecage serve` with the
# packaged server.toml, through which `codecage session create` and `exec` work; an
# upgrade to the same package as VERSION+1 keeps a locally changed conffile; purge leaves
# no file of codecage's (the overlay's upper layer, which holds every change the root
# saw, names none).
set -euo pipefail
deb=$(realpath "${1:?usage: try-package.sh DEB}")
image=${CODECAGE_IMAGE:-/var/lib/codecage/rootfs/default}
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 2; }
[ -x "$image/usr/bin/dpkg" ] || { echo "no Debian image with dpkg at $image (cargo xtask rootfs)" >&2; exit 2; }

tmp=$(mktemp -d /var/tmp/codecage-try-package.XXXXXX)
trap 'rm -rf --one-file-system "$tmp"' EXIT
mkdir -p "$tmp/upper" "$tmp/work" "$tmp/root" "$tmp/pkg"

# The upgrade: the same package, its version one patch level up.
dpkg-deb -R "$deb" "$tmp/pkg"
version=$(sed -n 's/^Version: //p' "$tmp/pkg/DEBIAN/control")
next="${version%.*}.$(( ${version##*.} + 1 ))"
sed -i "s/^Version: .*/Version: $next/" "$tmp/pkg/DEBIAN/control"
dpkg-deb --root-owner-group -Zxz -b "$tmp/pkg" "$tmp/next.deb" >/dev/null
cp "$deb" "$tmp/this.deb"

unshare --mount --propagation private bash -euo pipefail -c '
tmp=$1 image=$2 version=$3 next=$4
r=$tmp/root
mount -t overlay overlay -o "lowerdir=$image,upperdir=$tmp/upper,workdir=$tmp/work" "$r"
mkdir -p "$r/tmp/pkgs"
mount --bind "$tmp" "$r/tmp/pkgs"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
mount -t tmpfs tmpfs "$r/run"
# Host uids are allotted through one slots file for every codecage on the host: share it.
mkdir -p /run/codecage "$r/run/codecage" && touch /run/codecage/id-slots "$r/run/codecage/id-slots"
mount --bind /run/codecage/id-slots "$r/run/codecage/id-slots"
# Not a chroot (the kernel refuses a user namespace to a chrooted process): the overlay
# becomes the namespace s root, the host s stays under /oldroot.
mkdir -p "$r/oldroot"
cd "$r" && pivot_root . oldroot && cd /
o=/oldroot r=
inroot() { /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
step() { echo "try-package: $*"; }

step "install $version"
inroot dpkg -i /tmp/pkgs/this.deb >/dev/null
inroot dpkg-query -W -f="\${Status} \${Version}\n" codecage | grep -qx "install ok installed $version"
[ -L "$r/etc/systemd/system/multi-user.target.wants/codecage.service" ] || { echo "the unit was not enabled" >&2; exit 1; }
inroot codecage --version
inroot codecage profiles | grep "^ci: " >/dev/null
# (The image excludes /usr/share/man from every package: dpkg.cfg.d path-exclude.)
grep -q "^path-exclude=/usr/share/man" "$r"/etc/dpkg/dpkg.cfg.d/* 2>/dev/null || [ -f "$r/usr/share/man/man1/codecage-session-create.1.gz" ]

step "serve with the packaged server.toml; a session through it"
# The images of this host, read-only (bind-mounted only while the server runs).
mkdir -p "$r/var/lib/codecage/rootfs"
mount --bind -o ro "$o$image/.." "$r/var/lib/codecage/rootfs"
inroot sh -c "codecage serve --config /etc/codecage/server.toml >/run/serve.log 2>&1 & echo \$! >/run/serve.pid"
# A failure below must not leave the server running.
stop_server() { [ -s "$r/run/serve.pid" ] && kill -KILL "$(cat "$r/run/serve.pid")" 2>/dev/null || true; }
trap stop_server EXIT
for _ in $(seq 100); do [ -S "$r/run/codecage/codecage.sock" ] && break; sleep 0.2; done
id=$(inroot codecage session create --lang python | tail -n 1)
out=$(inroot codecage session exec "$id" -c "print(6 * 7)")
echo "$out" | grep -qx 42 || { echo "session exec printed: $out" >&2; cat "$r/run/serve.log" >&2; exit 1; }
inroot codecage session close "$id" >/dev/null
kill -TERM "$(cat "$r/run/serve.pid")"
for _ in $(seq 150); do [ -S "$r/run/codecage/codecage.sock" ] || break; sleep 0.2; done
pid=$(cat "$r/run/serve.pid")
for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
! kill -0 "$pid" 2>/dev/null || { echo "the server did not stop on SIGTERM" >&2; exit 1; }
: >"$r/run/serve.pid"
umount "$r/var/lib/codecage/rootfs"

step "upgrade to $next, keeping a changed conffile"
echo "# changed here" >>"$r/etc/codecage/server.toml"
inroot dpkg -i /tmp/pkgs/next.deb >/dev/null
inroot dpkg-query -W -f="\${Version}\n" codecage | grep -qx "$next"
grep -q "^# changed here" "$r/etc/codecage/server.toml"

step "purge"
mkdir -p "$r/var/cache/codecage/x" "$r/var/lib/codecage/audit"
touch "$r/var/lib/codecage/audit/audit.db"
umount "$r/run/codecage/id-slots"
inroot dpkg --purge codecage >/dev/null
# What the image had before (its own /usr/share/codecage/manifest.json) is not a leftover.
left=$(cd "$o$tmp/upper" && find . -path ./tmp/pkgs -prune -o -path ./run -prune -o -iname "*codecage*" -print |
    while read -r f; do [ -e "$o$image/$f" ] || echo "$f"; done)
[ -z "$left" ] || { echo "purge left: $left" >&2; exit 1; }
step "ok: install, serve and a session, upgrade, purge (nothing of codecage left)"
' try-package "$tmp" "$image" "$version" "$next"
