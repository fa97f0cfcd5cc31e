//! The sandbox's seccomp program, generated from the policy (profiles/seccomp/<arch>.json).
//! build.rs includes this file to embed the program (so a sandbox start pays nothing to
//! compile it), and src/sandbox/seccomp.rs's tests include it to check the program
//! against seccompiler's reading of the same policy, for both architectures.
//!
//! One program stands for what used to be three filters, each installed on its own: the
//! `allow` list (anything else ENOSYS), the `deny` list (EPERM; some with argument
//! conditions), and the netlink watch (user notifications for `socket(AF_NETLINK, ...)`
//! and `setsockopt(SOL_SOCKET, SO_RCVBUF)`, answered by the init). Each filter costs the
//! kernel a fixed price to attach (JIT, its executable page, and the syscall cache it
//! works out by running the filter for every syscall number of both ABIs), and
//! seccompiler's deny program, a linear chain of ~460 instructions, cost ~0.3 ms a
//! payload alone. Here the decision is one binary search over syscall numbers whose leaves
//! are the answer (allow, EPERM, ENOSYS) or, for the few syscalls whose answer depends on
//! the arguments, a jump to that syscall's block: its deny conditions (seccompiler's own
//! code for that syscall alone), then its watch, then allow.
//!
//! The answer is the one the three filters gave together, by the kernel's rules for
//! stacked filters (the strongest action wins, and among equal actions the filter
//! installed last): a foreign architecture is killed; a deny condition that matches is
//! EPERM; a syscall not on the allow list is ENOSYS (that errno outranked the watch's
//! notification); a watched call is a notification; the rest is allowed.

use std::collections::BTreeMap;

use seccompiler::{sock_filter, TargetArch};

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JA: u16 = 0x05; // BPF_JMP | BPF_JA
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
pub const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
pub const SECCOMP_RET_USER_NOTIF: u32 = 0x7fc0_0000;
pub const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
pub const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
/// seccomp_data.args[i]'s low half (both architectures are little-endian).
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}

// The netlink watch's constants: the generic socket ABI, the same on x86_64 and aarch64.
const AF_NETLINK: u32 = 16;
const SOL_SOCKET: u32 = 1;
const SO_RCVBUF: u32 = 8;

/// The audit architecture seccomp_data.arch holds for `target`.
pub fn audit_arch(target: TargetArch) -> u32 {
    match target {
        TargetArch::x86_64 => 0xc000_003e,
        TargetArch::aarch64 => 0xc000_00b7,
        _ => panic!("codecage has no seccomp policy for {target:?}"),
    }
}

/// What a syscall number's leaf in the search does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Leaf {
    Allow,
    Deny,
    NoSys,
    /// Jump to this syscall's block (its answer depends on its arguments).
    Block(u32),
}

/// The program for `policy` (the JSON text of profiles/seccomp/<arch>.json) on `target`.
/// Panics with the reason on a policy it cannot compile (build.rs reports it as the
/// build's error).
pub fn sandbox_program(policy: &str, target: TargetArch) -> Vec<sock_filter> {
    let json: serde_json::Value =
        serde_json::from_str(policy).unwrap_or_else(|e| panic!("seccomp policy: {e}"));
    let allow_filter = &json["allow"];
    let deny_filter = &json["deny"];
    assert_eq!(
        allow_filter["match_action"], "allow",
        "the allow filter must allow what it lists"
    );
    assert_eq!(
        deny_filter["mismatch_action"], "allow",
        "the deny filter must allow what it does not list"
    );
    let rules = |filter: &serde_json::Value| -> Vec<serde_json::Value> {
        filter["filter"]
            .as_array()
            .expect("a filter's \"filter\" is a list")
            .clone()
    };
    assert!(
        rules(allow_filter).iter().all(|r| r.get("args").is_none()),
        "the allow filter takes no argument conditions (put those in deny)"
    );
    let nosys = errno_action(&allow_filter["mismatch_action"]);
    let deny = errno_action(&deny_filter["match_action"]);

    let allowed: std::collections::BTreeSet<u32> = rules(allow_filter)
        .iter()
        .map(|rule| syscall_number(rule["syscall"].as_str().unwrap(), target))
        .collect();
    // The deny rules by syscall: unconditional ones, and the rules of those with arguments.
    let mut denied = std::collections::BTreeSet::new();
    let mut conditional: BTreeMap<u32, (String, Vec<serde_json::Value>)> = BTreeMap::new();
    for rule in rules(deny_filter) {
        let name = rule["syscall"].as_str().unwrap().to_string();
        let nr = syscall_number(&name, target);
        if rule.get("args").is_some() {
            conditional
                .entry(nr)
                .or_insert_with(|| (name, Vec::new()))
                .1
                .push(rule);
        } else {
            denied.insert(nr);
        }
    }
    let socket = syscall_number("socket", target);
    let setsockopt = syscall_number("setsockopt", target);

    // Every number the policy names, with its leaf; any other number is ENOSYS.
    let mut leaves: BTreeMap<u32, Leaf> = BTreeMap::new();
    for &nr in &allowed {
        leaves.insert(nr, Leaf::Allow);
    }
    for &nr in conditional.keys().chain([&socket, &setsockopt]) {
        leaves.insert(nr, Leaf::Block(nr));
    }
    for &nr in &denied {
        leaves.insert(nr, Leaf::Deny);
    }
    // Intervals [start, next start) of one leaf each, from 0 to u32::MAX: what the policy
    // names, and ENOSYS in the gaps.
    let mut intervals: Vec<(u32, Leaf)> = vec![(0, Leaf::NoSys)];
    let mut previous: Option<u32> = None;
    for (&nr, &leaf) in &leaves {
        if let Some(p) = previous.filter(|&p| p + 1 != nr) {
            push_interval(&mut intervals, p + 1, Leaf::NoSys);
        }
        push_interval(&mut intervals, nr, leaf);
        previous = Some(nr);
    }
    if let Some(p) = previous.filter(|&p| p < u32::MAX) {
        push_interval(&mut intervals, p + 1, Leaf::NoSys);
    }

    let mut program = vec![
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_ARCH),
        // A foreign architecture's numbers mean other syscalls: kill, as seccompiler does.
        jump(BPF_JEQ_K, audit_arch(target), 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, SECCOMP_DATA_NR),
    ];
    // The search, with each block's jump recorded to be resolved once the blocks are laid
    // out after it.
    let mut block_jumps: Vec<(usize, u32)> = Vec::new();
    emit_search(&intervals, nosys, deny, &mut program, &mut block_jumps);
    let mut block_at: BTreeMap<u32, usize> = BTreeMap::new();
    for (&nr, leaf) in &leaves {
        if *leaf != Leaf::Block(nr) {
            continue;
        }
        block_at.insert(nr, program.len());
        // 1. The deny conditions: seccompiler's program for this syscall alone, its
        //    "allow" (no condition held) turned into a jump past it.
        if let Some((name, rules)) = conditional.get(&nr) {
            let alone = serde_json::json!({
                "one": {
                    "mismatch_action": "allow",
                    "match_action": deny_filter["match_action"],
                    "filter": rules,
                }
            });
            let code = seccompiler::compile_from_json(alone.to_string().as_bytes(), target)
                .unwrap_or_else(|e| panic!("the deny rules of {name}: {e}"))
                .remove("one")
                .unwrap();
            let len = code.len();
            for (i, insn) in code.into_iter().enumerate() {
                if insn.code == BPF_RET_K && insn.k == SECCOMP_RET_ALLOW {
                    program.push(stmt(BPF_JA, (len - i - 1) as u32));
                } else {
                    assert!(
                        insn.code != BPF_RET_K
                            || insn.k == deny
                            || insn.k == SECCOMP_RET_KILL_PROCESS,
                        "the deny rules of {name}: an unexpected action {:#x}",
                        insn.k
                    );
                    program.push(insn);
                }
            }
        }
        // 2. Not on the allow list: ENOSYS, whatever the watch would say.
        if !allowed.contains(&nr) {
            program.push(stmt(BPF_RET_K, nosys));
            continue;
        }
        // 3. The netlink watch.
        if nr == socket {
            program.extend([
                stmt(BPF_LD_W_ABS, arg_low(0)),
                jump(BPF_JEQ_K, AF_NETLINK, 0, 1),
                stmt(BPF_RET_K, SECCOMP_RET_USER_NOTIF),
            ]);
        } else if nr == setsockopt {
            program.extend([
                stmt(BPF_LD_W_ABS, arg_low(1)),
                jump(BPF_JEQ_K, SOL_SOCKET, 0, 3),
                stmt(BPF_LD_W_ABS, arg_low(2)),
                jump(BPF_JEQ_K, SO_RCVBUF, 0, 1),
                stmt(BPF_RET_K, SECCOMP_RET_USER_NOTIF),
            ]);
        }
        // 4. Allowed.
        program.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW));
    }
    for (at, nr) in block_jumps {
        program[at].k = (block_at[&nr] - at - 1) as u32;
    }
    assert!(
        program.len() <= 4096,
        "the seccomp program has {} instructions; the kernel takes at most 4096",
        program.len()
    );
    program
}

fn push_interval(intervals: &mut Vec<(u32, Leaf)>, start: u32, leaf: Leaf) {
    let last = intervals.last_mut().unwrap();
    if last.0 == start {
        last.1 = leaf;
    } else if last.1 != leaf {
        // (Two neighbours with one answer are one interval; a block is one syscall's.)
        intervals.push((start, leaf));
    }
}

/// An errno action of the policy (`{"errno": N}`) as a return value.
fn errno_action(action: &serde_json::Value) -> u32 {
    let errno = action["errno"]
        .as_u64()
        .unwrap_or_else(|| panic!("expected an errno action, found {action}"));
    SECCOMP_RET_ERRNO | (errno as u32 & 0xffff)
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The number of instructions `emit_search` writes for `intervals`.
fn search_len(intervals: &[(u32, Leaf)]) -> usize {
    if intervals.len() == 1 {
        return 1;
    }
    let (left, right) = intervals.split_at(intervals.len() / 2);
    let l = search_len(left);
    1 + usize::from(l > 255) + l + search_len(right)
}

/// A binary search over `intervals` (sorted by start, the first starting at 0): each node
/// `jge <start of the right half>`, the left half falling through; a leaf is a return, or
/// a jump to a block. A right half out of a conditional jump's reach (255) is entered
/// through a `ja`.
fn emit_search(
    intervals: &[(u32, Leaf)],
    nosys: u32,
    deny: u32,
    program: &mut Vec<sock_filter>,
    block_jumps: &mut Vec<(usize, u32)>,
) {
    if let [(_, leaf)] = intervals {
        match *leaf {
            Leaf::Allow => program.push(stmt(BPF_RET_K, SECCOMP_RET_ALLOW)),
            Leaf::Deny => program.push(stmt(BPF_RET_K, deny)),
            Leaf::NoSys => program.push(stmt(BPF_RET_K, nosys)),
            Leaf::Block(nr) => {
                block_jumps.push((program.len(), nr));
                program.push(stmt(BPF_JA, 0));
            }
        }
        return;
    }
    let (left, right) = intervals.split_at(intervals.len() / 2);
    let l = search_len(left);
    match u8::try_from(l) {
        Ok(over) => program.push(jump(BPF_JGE_K, right[0].0, over, 0)),
        Err(_) => {
            program.push(jump(BPF_JGE_K, right[0].0, 0, 1));
            program.push(stmt(BPF_JA, l as u32));
        }
    }
    emit_search(left, nosys, deny, program, block_jumps);
    emit_search(right, nosys, deny, program, block_jumps);
}

/// The number of `name` on `target`, read off seccompiler's program for it alone (so the
/// policy file stays the one source of names, and seccompiler's tables the one of numbers).
pub fn syscall_number(name: &str, target: TargetArch) -> u32 {
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
