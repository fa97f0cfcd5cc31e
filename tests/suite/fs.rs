//! The filesystem the payload sees: a read-only root, writable and bounded /tmp and /work,
//! a fresh /proc, a minimal /dev, no /sys, no host secrets.

use super::common::*;

#[test]
fn the_root_usr_and_etc_are_read_only() {
    as_root(|| {
        let script = "for f in /usr/x /etc/x /x /bin/x /dev/x; do \
                        if echo x > $f; then echo \"$f writable\"; else echo \"$f refused\"; fi; done";
        let run = bash(&[], script);
        assert_eq!(
            run.stdout(),
            "/usr/x refused\n/etc/x refused\n/x refused\n/bin/x refused\n/dev/x refused\n",
            "{}",
            run.json
        );
        // Refused by the mount, not merely by permissions.
        assert_eq!(
            run.stderr_field().matches("Read-only file system").count(),
            5,
            "{}",
            run.json
        );
        // And the mounts say so: read-only, nosuid, nodev.
        let run = bash(&[], "cat /proc/self/mountinfo");
        let mounts = parse_mountinfo(run.stdout());
        for point in ["/", "/usr"] {
            let mount = mounts.iter().rfind(|m| m.mount_point == point);
            let mount = mount.unwrap_or_else(|| panic!("no {point} mount: {mounts:?}"));
            for flag in ["ro", "nosuid", "nodev"] {
                assert!(mount.options.iter().any(|o| o == flag), "{mount:?}");
            }
        }
    });
}

#[test]
fn tmp_and_work_are_writable() {
    as_root(|| {
        let run = bash(&[], "echo a > /tmp/a && echo b > /work/b && mkdir -p /work/d/e && cat /tmp/a /work/b && stat -c %U /work");
        assert_eq!(run.stdout(), "a\nb\nsandbox\n", "{}", run.json);
    });
}

#[test]
fn a_tmpfs_fills_to_its_size_and_no_further() {
    as_root(|| {
        let before = nix::sys::statvfs::statvfs("/tmp").unwrap();
        let script = "for d in /tmp /work; do \
                        dd if=/dev/zero of=$d/fill bs=1M count=64 2>&1 | grep -o 'No space left on device' | head -1; \
                        stat -c %s $d/fill; done";
        let run = bash(&["--tmp-size", "8M", "--work-size", "4M"], script);
        let lines: Vec<&str> = run.stdout().lines().collect();
        assert_eq!(lines[0], "No space left on device", "{}", run.json);
        assert_eq!(lines[2], "No space left on device", "{}", run.json);
        let (tmp, work): (u64, u64) = (lines[1].parse().unwrap(), lines[3].parse().unwrap());
        assert!((7 << 20..=8 << 20).contains(&tmp), "/tmp took {tmp} bytes");
        assert!(
            (3 << 20..=4 << 20).contains(&work),
            "/work took {work} bytes"
        );
        // The host's disk did not pay for it.
        let after = nix::sys::statvfs::statvfs("/tmp").unwrap();
        let used =
            |s: &nix::sys::statvfs::Statvfs| (s.blocks() - s.blocks_free()) * s.fragment_size();
        assert!(
            used(&after) < used(&before) + (8 << 20),
            "the host's /tmp grew"
        );
    });
}

#[test]
fn etc_holds_the_sandbox_user_and_no_host_secrets() {
    as_root(|| {
        let run = bash(&[], "ls /etc/shadow /etc/gshadow /etc/ssh /etc/ssl/private 2>&1 | grep -c 'No such'; getent passwd 1000; whoami");
        assert_eq!(
            run.stdout(),
            "4\nsandbox:x:1000:1000:sandbox:/work:/bin/bash\nsandbox\n",
            "{}",
            run.json
        );
        let host_users: Vec<String> = std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .lines()
            .map(|l| l.split(':').next().unwrap().to_string())
            .filter(|u| !["root", "nobody"].contains(&u.as_str()))
            .collect();
        let inside = bash(&[], "cut -d: -f1 /etc/passwd").stdout().to_string();
        for user in host_users {
            assert!(
                !inside.lines().any(|l| l == user),
                "host user {user} visible inside"
            );
        }
    });
}

#[test]
fn sys_holds_only_the_cpu_count_and_dev_is_minimal() {
    as_root(|| {
        let run = bash(
            &["--cpus", "0.5"],
            "find /sys -type f | sort | tr '\\n' ' '; cat /sys/devices/system/cpu/online; \
             touch /sys/x 2>&1 | grep -c 'Read-only'; ls /dev | tr '\\n' ' '",
        );
        assert_eq!(
            run.stdout(),
            "/sys/devices/system/cpu/online /sys/devices/system/cpu/possible /sys/devices/system/cpu/present \
             0\n1\nfd full null ptmx pts random shm stderr stdin stdout tty urandom zero ",
            "{}",
            run.json
        );
        let run = bash(
            &[],
            "head -c 4 /dev/zero | od -An -tx1; echo x > /dev/null && echo null-ok",
        );
        assert_eq!(run.stdout(), " 00 00 00 00\nnull-ok\n");
    });
}

#[test]
fn proc_is_the_sandboxs_own_and_its_kernel_knobs_are_read_only() {
    as_root(|| {
        let run = bash(
            &[],
            "ls /proc | grep -cE '^[0-9]+$'; cat /proc/self/mountinfo",
        );
        let (count, mountinfo) = run.stdout().split_once('\n').unwrap();
        // init, bash, ls (or grep): a handful, not the host's hundreds.
        let count: u32 = count.parse().unwrap();
        assert!(count <= 5, "{}", run.json);
        let mounts = parse_mountinfo(mountinfo);
        let sys = mounts.iter().rfind(|m| m.mount_point == "/proc/sys");
        let sys = sys.unwrap_or_else(|| panic!("no /proc/sys mount: {mounts:?}"));
        assert!(sys.options.iter().any(|o| o == "ro"), "{sys:?}");
    });
}

#[test]
fn a_prepared_rootfs_directory_is_mounted_read_only_as_root() {
    as_root(|| {
        let (dir, run) = bash_in_minimal_rootfs(
            true,
            "echo in-image; echo x > /bin/x || true; echo y > /work/y && echo work-ok",
        );
        assert_eq!(run.stdout(), "in-image\nwork-ok\n", "{}", run.json);
        assert!(run.stderr_field().contains("Read-only"), "{}", run.json);
        assert!(
            !dir.path().join("work/y").exists(),
            "the image's /work was written through"
        );
    });
}
