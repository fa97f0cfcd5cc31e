#!/bin/bash
# Tries the mount-namespace effects of the systemd unit's hardening directives on a
# codecage binary, without systemd and without changing the host: each case runs in a
# private mount namespace of its own (unshare -m, propagation private) that mounts what
# systemd would mount for the directive (see systemd.exec(5) and systemd's namespace.c),
# then runs two sandboxes there: `codecage run --lang python` (a sandbox's /proc, its
# cgroup, its mounts, its image) and the same with the restricted network (the gateway's
# link through /dev/net/tun).
#
#   packaging/debian/try-hardening.sh [CODECAGE]   (default target/debug/codecage)
#
# What it cannot try: directives that work through seccomp or the unit's cgroup
# (ProtectClock's device allow list, SystemCallFilter=, RestrictNamespaces=); the unit
# says why those were rejected.
set -uo pipefail
bin=$(realpath "${1:-target/debug/codecage}")
[ "$(id -u)" = 0 ] || { echo "run as root (codecage's launcher needs it)" >&2; exit 2; }
[ -x "$bin" ] || { echo "no codecage binary at $bin" >&2; exit 2; }
# The python profile with the restricted network (a gateway link through /dev/net/tun).
net_profile=$(mktemp --suffix=.toml)
trap 'rm -f "$net_profile"' EXIT
{ cat "$(dirname "$0")/../../profiles/python.toml"; printf '\n[network]\nmode = "restricted"\nallowed_hosts = ["pypi.org"]\n'; } >"$net_profile"

# What systemd does for each directive, as shell run inside the namespace before the run.
declare -A setup=(
  [none]=":"
  [ProtectHome=yes]='for d in /home /root /run/user; do [ -d $d ] && mount -t tmpfs -o ro,mode=000 inaccessible $d; done'
  [ProtectKernelLogs=yes]='touch /run/cc-inaccessible && chmod 000 /run/cc-inaccessible && mount --bind -o ro /run/cc-inaccessible /proc/kmsg && { [ -e /dev/kmsg ] && mount --bind /run/cc-inaccessible /dev/kmsg || true; }'
  [ProtectSystem=strict+ReadWritePaths]='mkdir -p /var/lib/codecage /run/codecage /var/cache/codecage
     for p in /var/lib/codecage /run/codecage /var/cache/codecage; do mount --bind $p $p; done
     findmnt -rn -o TARGET | while read -r m; do case $m in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*|/var/lib/codecage*|/run/codecage*|/var/cache/codecage*) ;; *) mount -o remount,bind,ro "$m" 2>/dev/null;; esac; done'
  [ProtectKernelTunables=yes]='mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys'
  [ProtectControlGroups=yes]='findmnt -rn -o TARGET | grep "^/sys/fs/cgroup" | while read -r m; do mount -o remount,bind,ro "$m"; done'
)
# ProtectKernelLogs=yes is not in the list: this simulation of it (the same inaccessible
# file bound over /proc/kmsg, with systemd's flags, under private, slave or shared
# propagation) makes the kernel refuse a sandbox's new procfs ("mount too revealing"), but
# under systemd 252 a service with the directive mounts a new procfs in a new user
# namespace (probed in the Debian 12 VM: `vm-run --lane debian12-systemd`, a oneshot unit
# with ProtectKernelLogs=yes running `unshare -Urmpf mount -t proc`), and the VM check's
# sessions run under the shipped unit, which keeps it. The simulation would report a break
# that is not there; the VM check (`cargo xtask dist --vm-check --try-hardening`) decides.
order=(none "ProtectHome=yes" "ProtectSystem=strict+ReadWritePaths" "ProtectKernelTunables=yes" "ProtectControlGroups=yes")
kept="${setup[ProtectHome=yes]}; ${setup[ProtectSystem=strict+ReadWritePaths]}"

try() {
  local name=$1 script=$2
  local out
  out=$(unshare --mount --propagation private bash -c "$script
    '$bin' run --lang python --timeout 60 -c 'import os; print(\"ran\", len(os.listdir(\"/proc\")) > 0)' 2>&1 &&
    '$bin' run --lang python --profile '$net_profile' --timeout 60 -c 'print(\"net ran\")' 2>&1" 2>&1)
  if grep -q '^ran True' <<<"$out" && grep -q '^net ran' <<<"$out"; then
    echo "works:  $name"
  else
    echo "BREAKS: $name: $(tr '\n' ' ' <<<"$out" | cut -c1-300)"
  fi
}
for name in "${order[@]}"; do try "$name" "${setup[$name]}"; done
try "the unit's (ProtectHome=yes, ProtectSystem=strict+ReadWritePaths)" "$kept"
