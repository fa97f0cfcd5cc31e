# The probe each VM lane runs before its tests (xtask/src/vm/matrix.rs): what the
# kernel offers codecage, what `codecage doctor` says, and what a run of the default
# python profile reports. Written as JSON to argv[1]; the support matrix is made of it.
# Runs as root in the guest, with CARGO_BIN_EXE_codecage set.
import ctypes
import errno
import json
import os
import subprocess
import sys

out = sys.argv[1]
exe = os.environ["CARGO_BIN_EXE_codecage"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def syscall(nr, *args):
    """The raw syscall: (return value, errno name or None)."""
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *args)
    e = ctypes.get_errno() if r < 0 else 0
    return r, (errno.errorcode.get(e, str(e)) if e else None)


class CloneArgs(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_uint64)
        for n in "flags pidfd child_tid parent_tid exit_signal stack stack_size tls "
        "set_tid set_tid_size cgroup".split()
    ]


features = {}
# clone3 (5.3): with no arguments it answers EINVAL where it exists, ENOSYS where not.
_, e = syscall(435, None, ctypes.c_size_t(0))
features["clone3"] = {"available": e != "ENOSYS", "probe": e}
# CLONE_INTO_CGROUP (5.7): with a closed fd as the cgroup, a kernel that knows the flag
# answers EBADF; an older clone3 refuses the flag itself (EINVAL).
args = CloneArgs(flags=0x200000000, exit_signal=17, cgroup=1000003)
r, e = syscall(435, ctypes.byref(args), ctypes.c_size_t(ctypes.sizeof(args)))
if r == 0:
    os._exit(0)  # a child: cannot happen with a closed fd
features["clone_into_cgroup"] = {"available": e == "EBADF", "probe": e}
# pidfd_open (5.3).
r, e = syscall(434, ctypes.c_int(os.getpid()), ctypes.c_uint(0))
if r >= 0:
    os.close(r)
features["pidfd_open"] = {"available": r >= 0, "probe": e}
# close_range (5.9) with CLOSE_RANGE_CLOEXEC (5.11), on fds nobody has open.
r, e = syscall(436, ctypes.c_uint(1 << 30), ctypes.c_uint(1 << 30), ctypes.c_uint(1 << 2))
features["close_range_cloexec"] = {"available": r == 0, "probe": e}
# landlock (5.13): the ABI, or why not.
r, e = syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
features["landlock"] = {"available": r > 0, "abi": r if r > 0 else None, "probe": e}
# The job's own cgroup on a v2 host: cgroup.kill (5.14), memory.peak (5.19).
mounts = open("/proc/self/mounts").read().split("\n")
v2 = any(len(m.split()) > 2 and m.split()[2] == "cgroup2" for m in mounts)
cg = [l[3:] for l in open("/proc/self/cgroup").read().splitlines() if l.startswith("0::")]
if v2 and cg:
    job = "/sys/fs/cgroup" + cg[0]
    for name in ["cgroup.kill", "memory.peak"]:
        features[name] = {"available": os.path.exists(os.path.join(job, name))}
try:
    lsm = open("/sys/kernel/security/lsm").read().strip()
except OSError as err:
    lsm = "unknown (%s)" % err


def codecage(*argv):
    p = subprocess.run([exe, *argv], capture_output=True, text=True, timeout=600)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"unparsed_stdout": p.stdout, "stderr": p.stderr, "status": p.returncode}


probe = {
    "kernel": os.uname().release,
    "lsm": lsm,
    "features": features,
    "cgroup_v2_mounted": v2,
    "doctor": codecage("doctor", "--json"),
    # The default python profile: no --profile, the language's own.
    "python": codecage(
        "run", "--json", "--rootfs", "host", "--lang", "python", "-c",
        "import sys; print('python', sys.version.split()[0], 'ran')",
    ),
}
with open(out, "w") as f:
    json.dump(probe, f, indent=1)
run = probe["python"]
print("probe: kernel %s, cgroup layout %s, landlock ABI %s; python: error=%s exit=%s %s" % (
    probe["kernel"], probe["doctor"].get("cgroup_layout"), run.get("landlock_abi"),
    run.get("error"), run.get("exit_code"), (run.get("stdout") or run.get("message") or "").strip()))
for s in run.get("skipped_layers") or []:
    print("probe: not enforced: %s %s: %s" % (s.get("layer"), s.get("feature"), s.get("reason")))
