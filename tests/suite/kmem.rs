//! Kernel memory a payload can pin outside its processes: socket queues, pipe buffers,
//! message queues, page tables, inotify and epoll instances. Each kind is pinned as far as
//! it goes under a 64M limit while the test watches the host's counters: it must be
//! charged to the run's memory cgroup (the run ends `oom`) or bounded per sandbox, and the
//! host must never lose much more than the limit.

use std::time::{Duration, Instant};

use super::common::*;

const SCRIPT: &str = include_str!("scripts/pin_kernel_memory.py");
const LIMIT_MIB: i64 = 64;

/// What the host lost while a run pinned `kind`, at worst: MemAvailable and the UDP
/// sockets' memory (/proc/net/sockstat), in MiB.
struct HostLoss {
    mem_available: i64,
    udp: i64,
}

/// The host's available memory, not counting what the machine's other load moves it by:
/// MemAvailable, plus AnonPages (one read of /proc/meminfo), plus the free pages parked on
/// the per-CPU lists (/proc/zoneinfo's pagesets). The other load (a `stress-ng --vm`
/// beside the tests, other programs' heaps, the sandbox's own, which its cgroup bounds)
/// allocates and frees anonymous memory all the time, and a page it frees sits on a
/// per-CPU list, counted nowhere, before it is free again: hundreds of MiB that would
/// count as the host's loss. Kernel memory pinned outside the processes (queues, buffers,
/// tables, tmpfs files) still does.
fn mem_available_kib() -> i64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> i64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/meminfo"))
    };
    field("MemAvailable:") + field("AnonPages:") + per_cpu_free_kib()
}

/// The free pages on the per-CPU lists (the `count:` of every pageset in /proc/zoneinfo).
fn per_cpu_free_kib() -> i64 {
    let page_kib = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .unwrap()
        .unwrap()
        / 1024;
    let pages: i64 = std::fs::read_to_string("/proc/zoneinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("count:"))
        .filter_map(|n| n.trim().parse::<i64>().ok())
        .sum();
    pages * page_kib
}

fn udp_pages() -> i64 {
    std::fs::read_to_string("/proc/net/sockstat")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("UDP:"))
        .and_then(|l| l.split_whitespace().skip_while(|w| *w != "mem").nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn pin(kind: &str) -> (Run, HostLoss) {
    let (mem0, udp0) = (mem_available_kib(), udp_pages());
    let child = codecage_run()
        .args([
            "--json",
            "--memory",
            &format!("{LIMIT_MIB}M"),
            "--timeout",
            &secs(30),
        ])
        .args(["--", "python3", "-c", SCRIPT, kind])
        .stdout(std::process::Stdio::piped())
        .launch();
    let (mut min_mem, mut max_udp) = (mem0, udp0);
    let pid = child.id();
    let end = Instant::now() + Duration::from_secs(60 * slowdown());
    while std::path::Path::new(&format!("/proc/{pid}/stat")).exists() && Instant::now() < end {
        min_mem = min_mem.min(mem_available_kib());
        max_udp = max_udp.max(udp_pages());
        // A zombie launcher has finished; stop sampling once it has.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if state.contains(") Z ") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let run = finish(child);
    let loss = HostLoss {
        mem_available: (mem0 - min_mem) / 1024,
        udp: (max_udp - udp0) * 4 / 1024,
    };
    (run, loss)
}

/// The host's loss stays within the limit twice over (v1 counts socket buffers apart from
/// the rest, each up to the limit) plus what the rest of the machine does meanwhile.
fn assert_host_held(kind: &str, run: &Run, loss: &HostLoss) {
    let bound = 2 * LIMIT_MIB + 96;
    assert!(
        loss.mem_available <= bound,
        "{kind}: the host lost {} MiB of available memory (bound {bound}): {}",
        loss.mem_available,
        run.json
    );
    assert!(
        loss.udp <= LIMIT_MIB + 8,
        "{kind}: UDP queues held {} MiB of host memory: {}",
        loss.udp,
        run.json
    );
}

/// Charged to the run's cgroup: the run ends at its memory limit.
fn assert_charged(kind: &str) {
    as_root(|| {
        let (run, loss) = pin(kind);
        assert_eq!(run.error(), Some("oom"), "{kind}: {}", run.json);
        assert_host_held(kind, &run, &loss);
    });
}

#[test]
fn udp_socket_queues_are_capped_per_sandbox() {
    as_root(|| {
        let (run, loss) = pin("udp");
        // v2 charges the queues to the memory limit (the run ends `oom`); v1 caps them with
        // a counter of their own, and datagrams past it are dropped while the program goes
        // on. Either way the host keeps its memory.
        assert!(
            run.error() == Some("oom") || run.stdout().starts_with("udp pinned"),
            "{}",
            run.json
        );
        assert_host_held("udp", &run, &loss);
    });
}

#[test]
fn unix_socket_queues_are_charged_or_bounded_by_the_fd_limit() {
    as_root(|| {
        let (run, loss) = pin("unix");
        // 120 socket pairs (the fd limit) of queued bytes: charged to the cgroup, so either
        // the limit ends the run or the queues fit in it.
        assert!(
            run.error() == Some("oom") || run.stdout().starts_with("unix pinned"),
            "{}",
            run.json
        );
        let peak = run.json["peak_memory_bytes"].as_u64().unwrap_or(0);
        assert!(peak > 16 << 20, "the queues were not charged: {}", run.json);
        assert_host_held("unix", &run, &loss);
    });
}

#[test]
fn pipe_buffers_are_charged_to_the_run() {
    assert_charged("pipe");
}

#[test]
fn sysv_message_queues_are_charged_to_the_run() {
    assert_charged("msgq");
}

#[test]
fn page_tables_are_charged_to_the_run() {
    assert_charged("pagetables");
}

#[test]
fn inotify_and_epoll_instances_are_bounded_per_sandbox() {
    as_root(|| {
        for kind in ["inotify", "epoll"] {
            let (run, loss) = pin(kind);
            assert!(run.stdout().contains("stopped"), "{kind}: {}", run.json);
            assert_host_held(kind, &run, &loss);
        }
    });
}

/// NETLINK_ROUTE reply queues are charged to no cgroup, so the init bounds them: at most
/// 16 netlink sockets at once, each with a 32 KiB queue the payload cannot raise. Sockets
/// parked in flight in a unix socket escape the count only up to the kernel's in-flight
/// limit (RLIMIT_NOFILE), and still with the small queue. What the queues hold is read
/// from the kernel's own count (the Rmem column of the sandbox's /proc/net/netlink): a few
/// MiB at most, far below what the host's MemAvailable moves by on its own while the test
/// samples it, so that is not the measure here.
#[test]
fn netlink_queues_are_bounded_per_sandbox() {
    as_root(|| {
        let pinned_kib = |run: &Run, kind: &str| -> i64 {
            run.stdout()
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{kind} pinned ")))
                .and_then(|l| l.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{}", run.json))
        };
        let (run, loss) = pin("netlink");
        assert!(
            run.stdout().starts_with("16 netlink sockets\n"),
            "{}",
            run.json
        );
        // 16 queues of 32 KiB (doubled by the kernel), and a reply past the last.
        assert!(pinned_kib(&run, "netlink") <= 16 * 80, "{}", run.json);
        assert!(loss.udp <= LIMIT_MIB + 8, "{}", run.json);
        let (run, loss) = pin("netlink-parked");
        // About 1000 sockets (the fd limit) of 32 KiB queues: well under the memory limit.
        assert!(
            pinned_kib(&run, "netlink-parked") < LIMIT_MIB * 1024 / 2,
            "{}",
            run.json
        );
        assert!(loss.udp <= LIMIT_MIB + 8, "{}", run.json);
    });
}
