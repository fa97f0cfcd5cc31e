//! The launcher <-> sandbox channel: a CLOEXEC stream socketpair whose sandbox end is fd 3 of
//! the init. A setup failure comes back as a typed error naming the step and the errno, never
//! as a bare exit status (youki's `channel.rs` and nsjail's done/error byte, in spirit).
//!
//! Frames, in order:
//! - launcher -> sandbox: the byte [`GO`] once the id maps are written (read by the raw child
//!   before it execs the init), then one [`TAG_MESSAGE`] frame holding the `Spec`.
//! - sandbox -> launcher: either a 6-byte [`TAG_RAW_ERROR`] frame from the raw child (it
//!   cannot allocate, so it sends a step number and the errno), or [`TAG_MESSAGE`] frames
//!   holding a [`Report`] as JSON behind a little-endian u32 length.

use std::fmt;
use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The "go" byte: maps are written; become root in the sandbox and exec the init.
pub const GO: u8 = b'G';
/// A raw error from the child before it exec'd the init: step number (u8), errno (i32 LE).
pub const TAG_RAW_ERROR: u8 = b'E';
/// A length-prefixed JSON message.
pub const TAG_MESSAGE: u8 = b'M';

/// The steps the raw child takes between clone3 and exec of the init, by number.
pub const RAW_STEPS: [&str; 7] = [
    "wait_for_go",
    "enter_sandbox_ids",
    "join_cgroups",
    "set_parent_death_signal",
    "attach_stdio",
    "close_inherited_fds",
    "exec_init",
];

/// The frame the raw child sends when raw step `step` failed with `errno`.
pub fn raw_error_frame(step: u8, errno: i32) -> [u8; 6] {
    let e = errno.to_le_bytes();
    [TAG_RAW_ERROR, step, e[0], e[1], e[2], e[3]]
}

/// A sandbox setup step that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupError {
    /// The step's name, as the function that performs it is called (`mount_proc`).
    pub step: String,
    /// The errno the kernel returned, 0 if none applies.
    pub errno: i32,
    /// What the step was doing, with its paths.
    pub detail: String,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sandbox setup failed at step {}: {}",
            self.step, self.detail
        )?;
        if self.errno != 0 {
            let errno = nix::errno::Errno::from_raw(self.errno);
            write!(f, ": {errno} ({})", errno.desc())?;
        }
        Ok(())
    }
}

impl std::error::Error for SetupError {}

/// What the sandbox's init reports to the launcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Report {
    /// A setup step failed; the payload never ran.
    SetupFailed(SetupError),
    /// A point of the sandbox's setup was reached, at this CLOCK_MONOTONIC time: the
    /// launcher turns these into `Outcome.phases`.
    Mark { phase: Phase, at_ns: u64 },
    /// The payload's hardening is in place and it is about to exec: which landlock ABI the
    /// kernel has, and what a best-effort layer could not enforce.
    Hardened {
        landlock_abi: Option<u32>,
        skipped: Vec<String>,
    },
    /// The payload ended: with an exit status, or by a signal.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

/// The points the sandbox reports the time of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The init's main began (after the exec).
    InitStarted,
    /// Namespaces, mounts, pivot_root, host name and loopback are done.
    SandboxBuilt,
    /// The payload is hardened and about to exec.
    PayloadReady,
    /// The init reaped the payload.
    PayloadExited,
}

/// Reports a phase mark; a launcher that is gone is not an error here.
pub fn mark(channel: &std::os::unix::net::UnixStream, phase: Phase) {
    let _ = write_message(
        &mut &*channel,
        &Report::Mark {
            phase,
            at_ns: crate::sys::monotonic_ns(),
        },
    );
}

/// Writes one length-prefixed JSON message.
pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("message over 4 GiB"))?;
    let mut frame = Vec::with_capacity(body.len() + 5);
    frame.push(TAG_MESSAGE);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)
}

/// Reads one length-prefixed JSON message, blocking.
pub fn read_message<T: DeserializeOwned>(r: &mut impl Read) -> io::Result<T> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    if head[0] != TAG_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected frame tag {:#x}", head[0]),
        ));
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Reassembles the sandbox's frames from the bytes the launcher reads as they arrive.
#[derive(Default)]
pub struct ReportReader {
    buf: Vec<u8>,
}

impl ReportReader {
    /// Appends bytes read from the channel.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete report, if one has arrived. A raw error frame becomes a
    /// `SetupFailed` naming the raw step.
    pub fn next_report(&mut self) -> Option<Result<Report, String>> {
        let tag = *self.buf.first()?;
        match tag {
            TAG_RAW_ERROR if self.buf.len() >= 6 => {
                let step = self.buf[1] as usize;
                let errno =
                    i32::from_le_bytes([self.buf[2], self.buf[3], self.buf[4], self.buf[5]]);
                self.buf.drain(..6);
                let name = RAW_STEPS.get(step).copied().unwrap_or("unknown");
                Some(Ok(Report::SetupFailed(SetupError {
                    step: name.into(),
                    errno,
                    detail: raw_step_detail(name).into(),
                })))
            }
            TAG_MESSAGE if self.buf.len() >= 5 => {
                let len = u32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() < 5 + len {
                    return None;
                }
                let report =
                    serde_json::from_slice(&self.buf[5..5 + len]).map_err(|e| e.to_string());
                self.buf.drain(..5 + len);
                Some(report)
            }
            TAG_RAW_ERROR | TAG_MESSAGE => None,
            other => {
                self.buf.clear();
                Some(Err(format!(
                    "unexpected frame tag {other:#x} from the sandbox"
                )))
            }
        }
    }
}

fn raw_step_detail(step: &str) -> &'static str {
    match step {
        "wait_for_go" => "waiting for the launcher to write the id maps",
        "enter_sandbox_ids" => "switching to the sandbox's root user (setresgid/setresuid 0)",
        "join_cgroups" => "moving into the run's v1 cgroups (writing 0 to their tasks files)",
        "set_parent_death_signal" => "setting PR_SET_PDEATHSIG",
        "attach_stdio" => "attaching stdin, stdout, stderr and the channel",
        "close_inherited_fds" => "marking inherited fds close-on-exec",
        "exec_init" => "executing the sandbox init (the codecage binary)",
        _ => "an unknown step",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_reassemble_across_partial_reads() {
        let mut wire = Vec::new();
        write_message(
            &mut wire,
            &Report::Exited {
                code: Some(3),
                signal: None,
            },
        )
        .unwrap();
        wire.extend_from_slice(&raw_error_frame(6, libc::ENOENT));
        let mut reader = ReportReader::default();
        let mut reports = Vec::new();
        for byte in wire {
            reader.feed(&[byte]);
            while let Some(r) = reader.next_report() {
                reports.push(r.unwrap());
            }
        }
        assert_eq!(
            reports[0],
            Report::Exited {
                code: Some(3),
                signal: None
            }
        );
        let Report::SetupFailed(err) = &reports[1] else {
            panic!("{reports:?}")
        };
        assert_eq!(err.step, "exec_init");
        assert_eq!(err.errno, libc::ENOENT);
        assert!(
            err.to_string().contains("exec_init") && err.to_string().contains("ENOENT"),
            "{err}"
        );
    }

    #[test]
    fn a_garbage_tag_is_an_error_not_a_hang() {
        let mut reader = ReportReader::default();
        reader.feed(b"xyz");
        assert!(reader.next_report().unwrap().is_err());
    }

    #[test]
    fn messages_round_trip() {
        let mut wire = Vec::new();
        let msg = Report::SetupFailed(SetupError {
            step: "mount_proc".into(),
            errno: 1,
            detail: "d".into(),
        });
        write_message(&mut wire, &msg).unwrap();
        let back: Report = read_message(&mut wire.as_slice()).unwrap();
        assert_eq!(back, msg);
    }
}
