//! The host's state, to compare before and after a test: its mount table, parsed by the
//! one mountinfo parser of the tests (which also reads the sandbox's own table).

/// One line of a mount table (`/proc/<pid>/mountinfo`, see proc_pid_mountinfo(5)).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Mount {
    /// The directory of the filesystem that is mounted (`/` for the whole filesystem).
    pub root: String,
    pub mount_point: String,
    /// The mount's own options (`ro`, `nosuid`, `nodev`, ...).
    pub options: Vec<String>,
    pub fs_type: String,
    pub source: String,
    /// The options of the filesystem (its superblock).
    pub super_options: Vec<String>,
}

/// Parses a mountinfo table: `id parent major:minor root mount-point options [optional
/// fields...] - fs-type source super-options`, paths with `\NNN` octal escapes.
pub fn parse_mountinfo(table: &str) -> Vec<Mount> {
    let mut mounts = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|f| *f == "-");
        let (Some(dash), true) = (dash, fields.len() > 5) else {
            panic!("not a mountinfo line: {line:?}");
        };
        let after = |i: usize| fields.get(dash + i).copied().unwrap_or_default();
        let list = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
        mounts.push(Mount {
            root: unescape(fields[3]),
            mount_point: unescape(fields[4]),
            options: list(fields[5]),
            fs_type: after(1).to_string(),
            source: unescape(after(2)),
            super_options: list(after(3)),
        });
    }
    mounts
}

/// Undoes the kernel's `\NNN` octal escapes (of space, tab, newline and backslash).
fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes
            .get(i + 1..i + 4)
            .filter(|_| bytes[i] == b'\\')
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match code {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).to_string()
}

/// The mount table of the host (of this test process, which runs in the host's mount
/// namespace).
pub fn host_mounts() -> Vec<Mount> {
    parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap())
}

/// The mounts of `a` that `b` lacks, counting duplicates: a mount stacked on an identical
/// one is a change too.
pub fn missing_from(a: &[Mount], b: &[Mount]) -> Vec<Mount> {
    let mut rest: Vec<&Mount> = b.iter().collect();
    a.iter()
        .filter(|m| match rest.iter().position(|r| r == m) {
            Some(i) => {
                rest.swap_remove(i);
                false
            }
            None => true,
        })
        .cloned()
        .collect()
}

#[test]
fn mountinfo_lines_parse_with_optional_fields_and_escapes() {
    let table = "36 35 98:0 /mnt1 /mnt\\040two rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue\n\
                 85 84 0:45 /sys /proc/sys ro,nosuid - proc proc rw\n";
    let mounts = parse_mountinfo(table);
    assert_eq!(mounts.len(), 2);
    assert_eq!(
        mounts[0],
        Mount {
            root: "/mnt1".into(),
            mount_point: "/mnt two".into(),
            options: vec!["rw".into(), "noatime".into()],
            fs_type: "ext3".into(),
            source: "/dev/root".into(),
            super_options: vec!["rw".into(), "errors=continue".into()],
        }
    );
    assert_eq!(
        (
            mounts[1].mount_point.as_str(),
            mounts[1].options[0].as_str()
        ),
        ("/proc/sys", "ro")
    );
    assert!(
        missing_from(&[mounts[1].clone(), mounts[1].clone()], &mounts) == [mounts[1].clone()],
        "a duplicate counts"
    );
}
