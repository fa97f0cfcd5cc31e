//! A build's numbered steps (the rootfs image, the VM image): a status line as each one
//! begins and ends, every tool's output in one build log, and when a step fails, the end
//! of what its tools wrote, with the whole log kept for later.

use std::fs;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;

use super::{check_interrupted, interrupted, secs, status, Runner};

/// How much of a failed step's output is shown (all of it is in the log).
const FAILED_OUTPUT_LINES: usize = 60;

pub struct Steps {
    /// What is built, for the status lines: `rootfs default`.
    what: String,
    total: usize,
    done: usize,
    log: PathBuf,
    verbose: bool,
    runner: Runner,
    /// Where the log is copied when a step fails.
    failed_log: PathBuf,
    /// Where the log stood when the last step began.
    step_offset: u64,
}

impl Steps {
    /// `total` steps building `what`, their tools' output into `log` (and to stderr too
    /// when `verbose`).
    pub fn new(
        what: &str,
        total: usize,
        log: PathBuf,
        verbose: bool,
        failed_log: PathBuf,
    ) -> Steps {
        Steps {
            what: what.to_string(),
            total,
            done: 0,
            runner: Runner::logging_to(log.clone(), verbose),
            log,
            verbose,
            failed_log,
            step_offset: 0,
        }
    }

    /// The runner for tools outside the steps (its notes go to the same log).
    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Run step `title`: `f` runs its tools with the runner it is given. An interrupt that
    /// came in meanwhile fails the step too.
    pub fn run<T>(&mut self, title: &str, f: impl FnOnce(&Runner) -> Result<T>) -> Result<T> {
        self.done += 1;
        let n = self.done;
        status(
            "Building",
            format!("{} (step {n}/{}: {title}) ...", self.what, self.total),
        );
        self.runner
            .note(&format!("===== step {n}/{}: {title} =====", self.total));
        self.step_offset = fs::metadata(&self.log).map_or(0, |m| m.len());
        let t = Instant::now();
        let result = f(&self.runner).and_then(|v| {
            check_interrupted()?;
            Ok(v)
        });
        match result {
            Ok(v) => {
                status(
                    "Done",
                    format!("step {n}/{} ({title}) in {}", self.total, secs(t.elapsed())),
                );
                Ok(v)
            }
            Err(e) => {
                self.report_failure(n);
                Err(e.context(format!(
                    "step {n}/{} ({title}) failed after {}",
                    self.total,
                    secs(t.elapsed())
                )))
            }
        }
    }

    /// Count step `title` as done without running it, saying `why`.
    pub fn skip(&mut self, title: &str, why: &str) {
        self.done += 1;
        status(
            "Skipped",
            format!("step {}/{} ({title}): {why}", self.done, self.total),
        );
    }

    /// What the tools wrote to the log during the last step (lossy UTF-8).
    pub fn last_output(&self) -> String {
        let mut buf = Vec::new();
        if let Ok(mut f) = fs::File::open(&self.log) {
            let _ = f.seek(SeekFrom::Start(self.step_offset));
            let _ = f.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Keep the whole log as `failed_log`, and show the end of step `n`'s output unless
    /// it was streamed already or the user interrupted the build.
    fn report_failure(&self, n: usize) {
        let copied = fs::copy(&self.log, &self.failed_log).is_ok();
        let full_log = if copied {
            format!("; full log: {}", self.failed_log.display())
        } else {
            String::new()
        };
        if interrupted().is_some() || self.verbose {
            if copied {
                eprintln!("full log: {}", self.failed_log.display());
            }
            return;
        }
        let output = self.last_output();
        let lines: Vec<&str> = output.lines().collect();
        let from = lines.len().saturating_sub(FAILED_OUTPUT_LINES);
        let shown = if from > 0 {
            format!("last {FAILED_OUTPUT_LINES} of {} lines", lines.len())
        } else {
            "all of it".to_string()
        };
        eprintln!(
            "--- output of step {n}/{} ({shown}{full_log}) ---",
            self.total
        );
        for l in &lines[from..] {
            eprintln!("{l}");
        }
        eprintln!("--- end of output ---");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_keeps_the_log_and_names_the_step() {
        let dir =
            crate::host::TempTree::create_in(&std::env::temp_dir(), "codecage-image-steps-test-")
                .unwrap();
        let log = dir.path().join("build.log");
        let failed = dir.path().join("failed.log");
        let mut steps = Steps::new("test", 3, log.clone(), false, failed.clone());
        let v = steps.run("first", |r| {
            r.note("one");
            Ok(1)
        });
        assert_eq!(v.unwrap(), 1);
        assert_eq!(steps.last_output(), "one\n");
        steps.skip("second", "nothing to do");
        let e = steps
            .run("third", |r| -> Result<()> {
                let mut cmd = std::process::Command::new("sh");
                cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
                r.run("sh", cmd)
            })
            .unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.starts_with("step 3/3 (third) failed after "), "{msg}");
        assert!(msg.ends_with("sh failed (exit status: 3)"), "{msg}");
        assert!(steps.last_output().contains("out\nerr\n"));
        assert_eq!(fs::read(&failed).unwrap(), fs::read(&log).unwrap());
    }
}
