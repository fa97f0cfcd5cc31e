# Runs /tmp/codecage/step.sh inside an image directory. Started by the rootfs
# build as `unshare --mount --propagation private -- sh -c <this> chroot.sh
# MODE ROOT STAGE`: every mount below is made in that private mount
# namespace, so it vanishes with it (on success, failure or kill alike) and
# never shows up in the host's mount table.
#
#   MODE   build: as root, with the host's DNS resolver and CA bundle bound
#                 in for the downloads (a TLS-intercepting proxy's CA, if the
#                 host trusts one), never copied into the image;
#          check: as uid/gid 1000 with the root bound read-only and tmpfs on
#                 /tmp and /work, the way the sandbox runs a payload.
#   ROOT   the image directory.
#   STAGE  a host directory copied to /tmp/codecage (step.sh, the recipe).
set -eu
mode=$1 root=$2 stage=$3
# The host's tools from the sbin directories too; the step gets the PATH we
# were given.
inner_path=$PATH
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
chroot_bin=$(command -v chroot)
[ -d "$root/etc" ] || { echo "chroot.sh: $root is not an image directory" >&2; exit 1; }

if [ "$mode" = check ]; then
    mount --bind "$root" "$root"
    mount -o remount,bind,ro "$root"
fi

mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o nosuid,noexec,mode=0755,size=1m dev "$root/dev"
for d in null zero full random urandom tty; do
    : > "$root/dev/$d"
    mount --bind "/dev/$d" "$root/dev/$d"
done
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
mkdir -m 1777 "$root/dev/shm"
mkdir "$root/dev/pts"
if mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts" 2>/dev/null; then
    ln -s pts/ptmx "$root/dev/ptmx"
fi
mount -t tmpfs -o nosuid,nodev,mode=1777 tmp "$root/tmp"
mkdir "$root/tmp/codecage"
cp -R "$stage/." "$root/tmp/codecage/"
chmod -R a+rX "$root/tmp/codecage"

case $mode in
build)
    for f in /etc/resolv.conf /etc/ssl/certs/ca-certificates.crt; do
        if [ -f "$f" ] && [ -f "$root$f" ] && [ ! -L "$root$f" ]; then
            mount --bind "$f" "$root$f"
        fi
    done
    PATH=$inner_path
    export PATH
    exec "$chroot_bin" "$root" /bin/sh -eu /tmp/codecage/step.sh
    ;;
check)
    mount -t tmpfs -o nosuid,nodev,mode=0700,uid=1000,gid=1000 work "$root/work"
    PATH=$inner_path
    export PATH
    exec "$chroot_bin" --userspec=1000:1000 --groups=1000 "$root" \
        /bin/sh -eu -c 'cd /work && exec /bin/sh -eu /tmp/codecage/step.sh'
    ;;
*)
    echo "chroot.sh: unknown mode $mode" >&2
    exit 2
    ;;
esac
