# Pins one kind of kernel memory in a sandbox as far as it will go, says how far, then
# holds it for 2 s so the test can read the host's counters. Used by tests/suite/kmem.rs.
import os, sys, socket, time, fcntl, select, ctypes, mmap
kind = sys.argv[1]
MiB = 1 << 20
keep = []
pinned = 0
def report(why):
    if kind.startswith("netlink"):  # small enough to count in KiB
        print(f"{kind} pinned {pinned // 1024} KiB ({why})", flush=True)
    else:
        print(f"{kind} pinned {pinned // MiB} MiB ({why})", flush=True)
try:
    if kind == "udp":
        # One sender, as many receivers as the fd limit allows, each queue filled to its
        # largest buffer: unaccounted, this pins about 1 GiB of host memory.
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); keep.append(s)
        for i in range(240):
            r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(("127.0.0.1", 0))
            r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * MiB)
            keep.append(r)
            for j in range(80):
                s.sendto(b"x" * 65000, r.getsockname()); pinned += 65000
    elif kind == "unix":
        for i in range(120):
            a, b = socket.socketpair(); a.setblocking(False); keep += [a, b]
            try:
                while True: pinned += a.send(b"x" * 65536)
            except BlockingIOError: pass
    elif kind in ("netlink", "netlink-parked"):
        # NETLINK_ROUTE replies queue in kernel memory no cgroup is charged for. Requests
        # sent and never read fill each socket's queue; "parked" first hides sockets in
        # flight in a unix socket (unbound, they hold nothing yet), then takes them all back.
        import struct, array
        def request(seq):
            ifi = struct.pack("=BxHiII", 0, 0, 1, 0, 0)  # RTM_GETLINK of lo, with an ack
            return struct.pack("=LHHLL", 16 + len(ifi), 18, 1 | 4, seq, 0) + ifi
        sockets = []
        netlink_table = open("/proc/net/netlink")  # opened now: the fds run out later
        def open_netlink():
            s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, 0)
            try: s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * MiB)
            except OSError: pass
            return s
        if kind == "netlink-parked":
            a, b = socket.socketpair(); keep += [a, b]
            try:
                while True:
                    batch = []
                    try:
                        for i in range(16): batch.append(open_netlink())
                    except OSError: pass
                    if not batch: break
                    socket.send_fds(a, [b"x"], [s.fileno() for s in batch])
                    for s in batch: s.close()
            except OSError as e: print("parking stopped:", e, flush=True)
            b.setblocking(False)
            try:
                while True:
                    _, fds, _, _ = socket.recv_fds(b, 1, 64)
                    if not fds: break
                    sockets += [socket.socket(fileno=fd) for fd in fds]
            except (BlockingIOError, OSError): pass
        try:
            while len(sockets) < 4096: sockets.append(open_netlink())
        except OSError: pass
        keep += sockets
        for s in sockets:
            # A reply takes about 2 KiB of a queue: 64 fill the largest one allowed.
            for j in range(64):
                try: s.send(request(j))
                except OSError: break
        # What the queues hold: the Rmem column of the namespace's netlink table.
        table = netlink_table.read().splitlines()[1:]
        pinned = sum(int(line.split()[4]) for line in table)
        print(f"{len(sockets)} netlink sockets", flush=True)
    elif kind == "pipe":
        for i in range(120):
            r, w = os.pipe(); keep += [r, w]
            try: fcntl.fcntl(w, 1031, MiB)
            except OSError: pass
            os.set_blocking(w, False)
            try:
                while True: pinned += os.write(w, b"x" * 65536)
            except BlockingIOError: pass
    elif kind == "msgq":
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(8 + 8192); buf[0] = b"\x01"
        for i in range(32000):
            q = libc.msgget(0, 0o1600)  # IPC_PRIVATE | IPC_CREAT | 0600
            if q < 0: raise OSError(ctypes.get_errno(), "msgget")
            while libc.msgsnd(q, buf, 8192, 0o4000) == 0: pinned += 8192  # IPC_NOWAIT
    elif kind == "pagetables":
        for i in range(4096):
            m = mmap.mmap(-1, 64 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000)  # MAP_NORESERVE
            for off in range(0, 64 * MiB, 2 * MiB): m[off] = 1
            keep.append(m); pinned += 32 * 4096 + 32 * 4096
    elif kind == "inotify":
        libc = ctypes.CDLL(None, use_errno=True)
        for i in range(100000):
            fd = libc.inotify_init1(0)
            if fd < 0: raise OSError(ctypes.get_errno(), "inotify_init1")
            keep.append(fd); pinned += 1024
    elif kind == "epoll":
        for i in range(100000):
            e = select.epoll(); keep.append(e); pinned += 1024
    report("done")
except OSError as e:
    report(f"stopped: {e}")
time.sleep(2)
