//! Compiles the seccomp policy of the target architecture (profiles/seccomp/<arch>.json)
//! into BPF at build time, so that a sandbox start pays nothing for it. The programs are
//! written as little-endian 8-byte records to OUT_DIR and embedded by
//! src/sandbox/seccomp.rs.
//!
//! The `deny` filter (few syscalls, with argument conditions) is seccompiler's program.
//! The `allow` filter is generated here as a binary search over ranges of syscall numbers:
//! seccompiler emits a linear chain of five instructions per syscall (1455 for the ~290 of
//! the allow list), which the kernel needed 1.1 ms to load, and which every syscall then
//! walks; the search is about 110 instructions (x86_64) and about 8 comparisons per syscall. The syscall numbers still
//! come from seccompiler's tables, by compiling each name alone and reading its number off
//! the program, so the policy file stays the one source of names.
//!
//! It also fingerprints the sources (`CODECAGE_BUILD_ID`): the launcher starts a sandbox's
//! init with it in the init's argv, and an init of another build (a `codecage-init` left
//! from an older install beside a newer `codecage`) refuses to start instead of
//! misreading the protocol.

use std::path::PathBuf;

use seccompiler::{sock_filter, TargetArch};

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_JGT_K: u16 = 0x25; // BPF_JMP | BPF_JGT | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;

fn main() {
    build_id();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").expect("target arch");
    let (file, target, audit_arch) = match arch.as_str() {
        "x86_64" => ("x86_64", TargetArch::x86_64, 0xc000_003e_u32),
        "aarch64" => ("aarch64", TargetArch::aarch64, 0xc000_00b7_u32),
        other => {
            panic!("codecage has no seccomp policy for {other}: add profiles/seccomp/{other}.json")
        }
    };
    let path = format!("profiles/seccomp/{file}.json");
    println!("cargo:rerun-if-changed={path}");
    println!("cargo:rerun-if-changed=build.rs");
    let text = std::fs::read_to_string(&path).expect("read the seccomp policy");
    let policy: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));

    let mut compiled = seccompiler::compile_from_json(text.as_bytes(), target)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let deny = compiled
        .remove("deny")
        .unwrap_or_else(|| panic!("{path} has no \"deny\" filter"));

    let allow_filter = &policy["allow"];
    assert_eq!(
        allow_filter["match_action"], "allow",
        "{path}: the allow filter must allow what it lists"
    );
    assert!(
        allow_filter["filter"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r.get("args").is_none()),
        "{path}: the allow filter takes no argument conditions (put those in deny)"
    );
    let errno = allow_filter["mismatch_action"]["errno"]
        .as_u64()
        .expect("allow's mismatch_action is an errno") as u32;
    let mut numbers: Vec<u32> = allow_filter["filter"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| syscall_number(rule["syscall"].as_str().unwrap(), target))
        .collect();
    numbers.sort_unstable();
    numbers.dedup();
    let allow = search_program(
        audit_arch,
        &ranges(&numbers),
        SECCOMP_RET_ERRNO | (errno & 0xffff),
    );

    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    for (name, program) in [("allow", allow), ("deny", deny)] {
        let mut bytes = Vec::with_capacity(program.len() * 8);
        for insn in program {
            bytes.extend_from_slice(&insn.code.to_le_bytes());
            bytes.push(insn.jt);
            bytes.push(insn.jf);
            bytes.extend_from_slice(&insn.k.to_le_bytes());
        }
        std::fs::write(out.join(format!("seccomp-{name}.bpf")), bytes).expect("write BPF");
    }
}

/// The number of `name` on `target`, read off seccompiler's program for it alone.
fn syscall_number(name: &str, target: TargetArch) -> u32 {
    let json = format!(
        r#"{{"one": {{"mismatch_action": "allow", "match_action": "trap", "filter": [{{"syscall": "{name}"}}]}}}}"#
    );
    let program = seccompiler::compile_from_json(json.as_bytes(), target)
        .unwrap_or_else(|e| panic!("syscall {name}: {e}"))
        .remove("one")
        .unwrap();
    // After the arch check comes `ld nr`, then `jeq <number>`.
    let at = program
        .iter()
        .position(|i| i.code == BPF_LD_W_ABS && i.k == SECCOMP_DATA_NR)
        .unwrap_or_else(|| {
            panic!("syscall {name}: no syscall-number load in seccompiler's program")
        });
    let jeq = &program[at + 1];
    assert_eq!(
        jeq.code, BPF_JEQ_K,
        "syscall {name}: unexpected program shape"
    );
    jeq.k
}

/// Sorted numbers into inclusive ranges of consecutive numbers.
fn ranges(numbers: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &n in numbers {
        match out.last_mut() {
            Some((_, hi)) if *hi + 1 == n => *hi = n,
            _ => out.push((n, n)),
        }
    }
    out
}

#[derive(Clone, Copy)]
enum Target {
    Allow,
    Deny,
    At(usize),
}

/// arch check; ld nr; a binary search over `ranges`; ret allow; ret `deny`.
fn search_program(audit_arch: u32, ranges: &[(u32, u32)], deny: u32) -> Vec<sock_filter> {
    // Instructions with symbolic jump targets: (code, jt, jf, k).
    let mut code: Vec<(u16, Target, Target, u32)> = vec![
        (
            BPF_LD_W_ABS,
            Target::At(1),
            Target::At(1),
            SECCOMP_DATA_ARCH,
        ),
        // A foreign architecture's numbers mean other syscalls: kill, as seccompiler does.
        (BPF_JEQ_K, Target::At(3), Target::At(2), audit_arch),
        (
            BPF_RET_K,
            Target::At(0),
            Target::At(0),
            SECCOMP_RET_KILL_PROCESS,
        ),
        (BPF_LD_W_ABS, Target::At(4), Target::At(4), SECCOMP_DATA_NR),
    ];
    emit(ranges, &mut code);
    let allow_at = code.len();
    let deny_at = allow_at + 1;
    code.push((BPF_RET_K, Target::At(0), Target::At(0), SECCOMP_RET_ALLOW));
    code.push((BPF_RET_K, Target::At(0), Target::At(0), deny));
    let offset = |from: usize, to: Target| -> u8 {
        let to = match to {
            Target::Allow => allow_at,
            Target::Deny => deny_at,
            Target::At(i) => i,
        };
        u8::try_from(to - from - 1).expect("seccomp allow program too long for 8-bit jumps")
    };
    code.iter()
        .enumerate()
        .map(|(i, &(c, jt, jf, k))| {
            let jump = c & 0x07 == 0x05 && c != 0x05; // BPF_JMP class, conditional
            sock_filter {
                code: c,
                jt: if jump { offset(i, jt) } else { 0 },
                jf: if jump { offset(i, jf) } else { 0 },
                k,
            }
        })
        .collect()
}

/// Emits the search for `ranges` at the end of `code`; falls through to nothing (every path
/// ends in a jump to Allow or Deny).
fn emit(ranges: &[(u32, u32)], code: &mut Vec<(u16, Target, Target, u32)>) {
    match ranges {
        [] => code.push((BPF_JEQ_K, Target::Deny, Target::Deny, 0)),
        [(lo, hi)] => {
            let here = code.len();
            // nr >= lo ? (nr > hi ? deny : allow) : deny
            code.push((BPF_JGE_K, Target::At(here + 1), Target::Deny, *lo));
            code.push((BPF_JGT_K, Target::Deny, Target::Allow, *hi));
        }
        _ => {
            let mid = ranges.len() / 2;
            let here = code.len();
            code.push((
                BPF_JGE_K,
                Target::At(0),
                Target::At(here + 1),
                ranges[mid].0,
            ));
            emit(&ranges[..mid], code);
            let right = code.len();
            code[here].1 = Target::At(right);
            emit(&ranges[mid..], code);
        }
    }
}

/// `CODECAGE_BUILD_ID`: FNV-1a over the path and content of every file under src/ and
/// drivers/, in path order. Both binaries link the same library, so they agree exactly
/// when they come from one build.
fn build_id() {
    fn walk(dir: &std::path::Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir)
            .expect("read a source directory")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, files);
            } else {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for dir in ["src", "drivers"] {
        println!("cargo:rerun-if-changed={dir}");
        walk(std::path::Path::new(dir), &mut files);
    }
    files.sort();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for file in &files {
        let bytes = std::fs::read(file).expect("read a source file");
        for byte in file.to_string_lossy().bytes().chain(bytes) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    println!("cargo:rustc-env=CODECAGE_BUILD_ID={hash:016x}");
}
