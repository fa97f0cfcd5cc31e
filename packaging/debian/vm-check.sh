#!/bin/bash
# The package under real systemd: runs inside the debian12-systemd VM (Debian 12, systemd as
# pid 1), started by `cargo xtask dist --vm-check`, which puts in DIR the package (this.deb)
# and the same package with its version one patch level up (next.deb).
#
#   vm-check.sh DIR      (TRY_HARDENING=1: also try each hardening directive, see below)
#
# Steps, each reported as "vm-check: ok: STEP" or, for the first that fails,
# "vm-check: FAILED: STEP: why" with the unit's journal, and status 1:
#   install   apt-get install DIR/this.deb (no network: its dependencies are installed);
#             the unit is enabled and active, its socket is there
#   session   `codecage session create` and `exec` through the service; the sandbox's
#             processes are in the unit's own cgroup (.../codecage.service/codecage/...),
#             the server in .../codecage.service/supervisor, nothing in a /codecage at the
#             root of the hierarchy; closing the session removes its cgroup
#   harden    (TRY_HARDENING=1) each directive of the list below in a drop-in, the service
#             restarted, the session check again: works or breaks, with why
#   upgrade   apt-get install DIR/next.deb: the new version, the service restarted (a new
#             main pid) and active, the session check again
#   stop      `systemctl stop` ends the service and every sandbox with it
#   purge     apt-get purge: the package's files (dpkg -L before), /etc/codecage,
#             /var/lib/codecage, /var/cache/codecage, /run/codecage and the unit's cgroup
#             are gone, and the root file system has no path that it did not have before
#             the install
set -uo pipefail
dir=${1:?usage: vm-check.sh DIR}
export DEBIAN_FRONTEND=noninteractive
work=/run/vm-check
mkdir -p "$work"
step=start
journal() {
	journalctl -u codecage --no-pager -n "${1:-40}" -o short-monotonic 2>/dev/null | sed 's/^/    journal: /'
}
fail() {
	echo "vm-check: FAILED: $step: $*"
	journal 60
	exit 1
}
ok() { echo "vm-check: ok: $step${1:+: $1}"; }
# A snapshot of the root file system's paths, without what changes by itself (logs, apt's
# and dpkg's own state, systemd's).
snapshot() {
	find / -xdev \( -path /var/log -o -path /var/lib/dpkg -o -path /var/lib/apt -o \
		-path /var/cache/apt -o -path /var/cache/debconf -o -path /var/lib/systemd -o \
		-path /var/tmp -o -path /tmp -o -path /root \) -prune -o -print | LC_ALL=C sort
}
wait_active() {
	for _ in $(seq 150); do
		[ "$(systemctl is-active codecage)" = active ] && [ -S /run/codecage/codecage.sock ] && return 0
		sleep 0.2
	done
	return 1
}
main_pid() { systemctl show -P MainPID codecage; }
# The operator profile of the sessions here: python on the VM's own /usr (it has no
# codecage image, and no network to build one). Removed before the purge.
profile=/etc/codecage/profiles/vmcheck.toml
write_profile() {
	printf 'description = "vm-check: python on the host'"'"'s /usr"\nlanguage = "python"\nrootfs = "host"\n' >"$profile"
	# The same with the restricted network: the gateway's link through /dev/net/tun, what
	# a unit's device policy (ProtectClock=, PrivateDevices=, DevicePolicy=) takes away.
	{ cat "$profile"; printf '[network]\nmode = "restricted"\nallowed_hosts = ["pypi.org"]\n'; } >"$net_profile"
}
net_profile=/etc/codecage/profiles/vmcheck-net.toml
# session_check: a session through the service, its cgroup under the unit's, its
# removal on close. Prints why on failure (status 1).
session_check() {
	local id out cg pids pid comm found=
	id=$(codecage session create --lang python --profile vmcheck 2>&1 | tail -n 1) || {
		echo "session create: $id"
		return 1
	}
	out=$(codecage session exec "$id" -c 'import os; print(6 * 7, os.getpid())' 2>&1)
	[ "${out%% *}" = 42 ] || {
		echo "session exec printed: $out"
		return 1
	}
	cg=/sys/fs/cgroup$(systemctl show -P ControlGroup codecage)
	[ "$cg" = /sys/fs/cgroup/system.slice/codecage.service ] || {
		echo "the unit's cgroup is $cg"
		return 1
	}
	grep -qx "$(main_pid)" "$cg/supervisor/cgroup.procs" 2>/dev/null || {
		echo "the server (pid $(main_pid)) is not in $cg/supervisor: $(cat /proc/"$(main_pid)"/cgroup)"
		return 1
	}
	[ ! -e /sys/fs/cgroup/codecage ] || {
		echo "a /sys/fs/cgroup/codecage exists: sandboxes outside the unit's cgroup"
		return 1
	}
	pids=$(find "$cg/codecage" -mindepth 2 -name cgroup.procs -exec cat {} + 2>/dev/null)
	for pid in $pids; do
		comm=$(cat /proc/"$pid"/comm 2>/dev/null)
		case "$comm" in python*) found="$pid $(sed 's/^0:://' /proc/"$pid"/cgroup)" ;; esac
	done
	[ -n "$found" ] || {
		echo "no python process in $cg/codecage/*: $(find "$cg" -type d | tr '\n' ' ')"
		return 1
	}
	codecage session close "$id" >/dev/null 2>&1 || {
		echo "session close failed"
		return 1
	}
	for _ in $(seq 50); do
		[ -z "$(find "$cg/codecage" -mindepth 1 -type d 2>/dev/null)" ] && break
		sleep 0.2
	done
	[ -z "$(find "$cg/codecage" -mindepth 1 -type d 2>/dev/null)" ] || {
		echo "left after close: $(find "$cg/codecage" -mindepth 1 -type d | tr '\n' ' ')"
		return 1
	}
	id=$(codecage session create --lang python --profile vmcheck-net 2>&1 | tail -n 1) || {
		echo "session create with the restricted network: $id"
		return 1
	}
	out=$(codecage session exec "$id" -c 'import socket; print(len(socket.if_nameindex()) > 1)' 2>&1)
	codecage session close "$id" >/dev/null 2>&1
	[ "$out" = True ] || {
		echo "session exec with the restricted network printed: $out"
		return 1
	}
	echo "the session's python (pid $found), and one with the restricted network"
}

step=system
state=$(systemctl is-system-running)
failed=$(systemctl list-units --failed --plain --no-legend | awk '{print $1}' | tr '\n' ' ')
[ "$state" = running ] || [ "$state" = degraded ] || fail "systemd is $state"
ok "$(uname -r), systemd $(systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p') as pid 1 ($(cat /proc/1/comm)), $state${failed:+ (failed: $failed)}, cgroup $(stat -fc %T /sys/fs/cgroup)"
[ "$(cat /proc/1/comm)" = systemd ] || fail "pid 1 is $(cat /proc/1/comm)"
snapshot >"$work/before"

step=install
version=$(dpkg-deb -f "$dir/this.deb" Version)
next=$(dpkg-deb -f "$dir/next.deb" Version)
apt-get install -y --no-install-recommends "$dir/this.deb" >"$work/apt.log" 2>&1 || {
	sed 's/^/    apt: /' "$work/apt.log"
	fail "apt-get install"
}
[ "$(dpkg-query -W -f '${Status} ${Version}' codecage)" = "install ok installed $version" ] ||
	fail "dpkg-query: $(dpkg-query -W -f '${Status} ${Version}' codecage)"
dpkg -L codecage >"$work/files"
[ "$(systemctl is-enabled codecage)" = enabled ] || fail "the unit is $(systemctl is-enabled codecage)"
wait_active || fail "the service is $(systemctl is-active codecage), socket: $(ls -l /run/codecage 2>&1)"
ok "codecage $version, $(wc -l <"$work/files") paths, the unit enabled and active (pid $(main_pid))"

step=run
# What a user types first, through the installed binaries (the session step goes through
# the server): a run as root, and one for a sudo caller, whose supplementary groups come
# through NSS (a statically linked codecage crashed there: ARCHITECTURE.md).
out=$(codecage run --rootfs host -- id -u 2>&1) || fail "codecage run: $out"
[ "$out" = 1000 ] || fail "codecage run -- id -u printed: $out"
out=$(SUDO_UID=65534 SUDO_GID=65534 SUDO_USER=nobody codecage run --rootfs host -- id -u 2>&1) ||
	fail "codecage run for a sudo caller (nobody): $out"
[ "$out" = 1000 ] || fail "codecage run for a sudo caller printed: $out"
ok "as root and for a sudo caller: uid $out in the sandbox (nsswitch: $(grep -h '^group:' /etc/nsswitch.conf | tr -s ' \t' ' '))"

step=session
write_profile
why=$(session_check) || fail "$why"
ok "$why"

if [ "${TRY_HARDENING:-}" = 1 ]; then
	# Each directive alone on top of the unit as shipped, in a runtime drop-in.
	dropin=/run/systemd/system/codecage.service.d
	mkdir -p "$dropin"
	while read -r directive; do
		[ -z "$directive" ] && continue
		step="harden $directive"
		printf '[Service]\n%s\n' "$directive" >"$dropin/try.conf"
		systemctl daemon-reload
		systemctl restart codecage 2>/dev/null
		if ! wait_active; then
			echo "vm-check: harden: BREAKS: $directive: the service does not start: $(journal 5 | tail -n 3 | tr '\n' ' ')"
		elif why=$(session_check); then
			echo "vm-check: harden: works: $directive"
		else
			echo "vm-check: harden: BREAKS: $directive: $why $(journal 3 | tr '\n' ' ' | cut -c1-400)"
		fi
	done <<'EOF'
ProtectKernelLogs=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
PrivateTmp=yes
PrivateDevices=yes
PrivateMounts=yes
PrivateIPC=yes
NoNewPrivileges=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
RestrictNamespaces=yes
MemoryDenyWriteExecute=yes
SystemCallFilter=@system-service
KeyringMode=private
RemoveIPC=yes
UMask=0077
DevicePolicy=closed
EOF
	rm -rf "$dropin"
	systemctl daemon-reload
	systemctl restart codecage
	step=harden
	wait_active || fail "the service as shipped does not start again"
	ok "tried"
fi

step=upgrade
pid=$(main_pid)
echo "# changed here" >>/etc/codecage/server.toml
apt-get install -y --no-install-recommends "$dir/next.deb" >"$work/apt.log" 2>&1 || {
	sed 's/^/    apt: /' "$work/apt.log"
	fail "apt-get install of $next"
}
[ "$(dpkg-query -W -f '${Status} ${Version}' codecage)" = "install ok installed $next" ] ||
	fail "dpkg-query: $(dpkg-query -W -f '${Status} ${Version}' codecage)"
grep -q '^# changed here' /etc/codecage/server.toml || fail "the changed conffile server.toml was replaced"
wait_active || fail "the service is $(systemctl is-active codecage) after the upgrade"
[ "$(main_pid)" != "$pid" ] || fail "the service was not restarted (main pid $pid before and after)"
why=$(session_check) || fail "$why"
ok "$version -> $next, restarted (pid $pid -> $(main_pid)), changed conffile kept; $why"

step=stop
id=$(codecage session create --lang python --profile vmcheck 2>&1 | tail -n 1)
codecage session exec "$id" -c 'print(1)' >/dev/null 2>&1 || fail "no session before the stop: $id"
systemctl stop codecage || fail "systemctl stop"
[ "$(systemctl is-active codecage)" = inactive ] || fail "the service is $(systemctl is-active codecage) after stop"
[ ! -e /sys/fs/cgroup/system.slice/codecage.service ] || fail "the unit's cgroup is left: $(find /sys/fs/cgroup/system.slice/codecage.service -name cgroup.procs -exec cat {} +)"
pgrep -x python3 >/dev/null && fail "python processes are left: $(pgrep -a python3)"
[ ! -S /run/codecage/codecage.sock ] || fail "the socket is left"
ok "a session open: the service, its cgroup and the sandbox are gone"
systemctl start codecage
wait_active || fail "the service does not start again"

step=purge
rm -f "$profile" "$net_profile"
apt-get purge -y codecage >"$work/apt.log" 2>&1 || {
	sed 's/^/    apt: /' "$work/apt.log"
	fail "apt-get purge"
}
status=$(dpkg-query -W -f '${Status}' codecage 2>/dev/null)
case "$status" in "" | *not-installed) ;; *) fail "dpkg-query after the purge: $status" ;; esac
systemctl is-active codecage >/dev/null && fail "the service still runs"
left=
while read -r path; do
	# Directories the package shares with the system (/usr/bin, /etc) were there before
	# (under their real name: /lib/systemd is /usr/lib/systemd on a merged /usr).
	[ -e "$path" ] || [ -L "$path" ] || continue
	grep -qxF "$path" "$work/before" || grep -qxF "$(readlink -f "$path")" "$work/before" ||
		left="$left $path"
done <"$work/files"
[ -z "$left" ] || fail "the package's paths left:$left"
for path in /etc/codecage /var/lib/codecage /var/cache/codecage /run/codecage \
	/sys/fs/cgroup/system.slice/codecage.service /sys/fs/cgroup/codecage; do
	[ ! -e "$path" ] || fail "$path is left"
done
systemctl daemon-reload
[ -z "$(systemctl list-unit-files --no-legend codecage.service)" ] || fail "the unit is still known: $(systemctl list-unit-files --no-legend codecage.service)"
snapshot >"$work/after"
new=$(LC_ALL=C comm -13 "$work/before" "$work/after")
[ -z "$new" ] || fail "paths that were not there before the install: $(echo "$new" | head -n 20 | tr '\n' ' ')"
ok "$(wc -l <"$work/files") paths of the package gone, no new path on the root file system, no cgroup"
echo "vm-check: all steps passed"
