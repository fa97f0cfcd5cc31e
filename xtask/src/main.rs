//! Developer tasks: `cargo xtask <task>` (`cargo xtask --help` lists them).
//!
//! * `test`: the project's test command (`test.rs`).
//! * `bench`: codecage against bare execution, bubblewrap and crun (`bench.rs`).
//! * `compat`: CPython's regression tests and a Node suite bare and in the sandbox, side
//!   by side; writes COMPATIBILITY.md (`compat.rs`).
//! * `dist`: the Debian package (`dist.rs`, `packaging/debian/`).
//! * `rootfs`: the sandbox's root filesystem image (`rootfs.rs`, a front end over the
//!   `codecage-image` crate in `image/`; `rootfs/README.md` at the workspace root).
//! * `vm-build`, `vm-run`, `vm-test`, `vm-check`, `vm-matrix`: the VM test lanes (kernels
//!   and cgroup layouts users run; `vm/`, and `xtask/vm/README.md`).
//!
//! `host` holds what the tasks share: root, commands and their process groups, interrupts,
//! apt-get and the Debian mirror, build steps, safe removal of trees (the `codecage-image`
//! crate's, which the rootfs build uses), and the workspace.

mod bench;
mod bench_burst;
mod bench_pool;
mod bench_pool_rate;
mod bench_sessions;
mod compat;
mod dist;
mod host;
mod rootfs;
mod test;
mod vm;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "codecage's developer tasks",
    after_help = "`cargo xtask <task> --help` describes a task.",
    arg_required_else_help = true,
    // A repeated option takes its last value, as it always did here.
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand, Debug)]
enum Task {
    Test(test::Args),
    Bench(bench::Args),
    Compat(compat::Args),
    Dist(dist::Args),
    Rootfs(rootfs::Args),
    VmBuild(vm::lane::BuildArgs),
    VmRun(vm::run::RunOptions),
    VmTest(vm::lane::TestArgs),
    VmCheck(vm::lane::CheckArgs),
    VmMatrix(vm::lane::MatrixArgs),
}

impl Task {
    /// The tasks that turn SIGINT/SIGTERM/SIGHUP into a flag their wait loops poll, so
    /// that they can stop QEMU or mmdebstrap and clean up. (`rootfs` installs the same
    /// handlers itself, around the build only.)
    fn polls_interrupts(&self) -> bool {
        if let Task::Dist(args) = self {
            return args.boots_a_vm();
        }
        matches!(
            self,
            Task::Test(_)
                | Task::Compat(_)
                | Task::VmBuild(_)
                | Task::VmRun(_)
                | Task::VmTest(_)
                | Task::VmCheck(_)
                | Task::VmMatrix(_)
        )
    }

    /// The task's exit status (an error is reported by `main`).
    fn run(self) -> Result<i32> {
        match self {
            Task::Test(args) => test::test(&args),
            Task::Bench(args) => bench::bench(&args),
            Task::Compat(args) => compat::compat(&args),
            Task::Dist(args) => dist::dist(&args),
            Task::Rootfs(args) => rootfs::rootfs(&args),
            Task::VmBuild(args) => vm::lane::vm_build(&args),
            Task::VmRun(opts) => vm::run::vm_run(&opts),
            Task::VmTest(args) => vm::lane::vm_test(&args),
            Task::VmCheck(args) => vm::lane::vm_check(&args),
            Task::VmMatrix(args) => vm::lane::vm_matrix(&args),
        }
    }
}

/// The exit status of a task that failed, or whose arguments were wrong: 125 for the
/// tasks that run a command in the VM (what their callers read as "the VM lane could
/// not run it", see `xtask/vm/README.md`), 1 for the others.
fn failure_status(task: &str) -> ExitCode {
    match task {
        "vm-run" | "vm-test" | "vm-check" | "vm-matrix" => ExitCode::from(vm::EXIT_VM_FAILED as u8),
        _ => ExitCode::FAILURE,
    }
}

fn main() -> ExitCode {
    let task_name = std::env::args().nth(1).unwrap_or_default();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    ExitCode::from(e.exit_code() as u8)
                }
                _ => failure_status(&task_name),
            };
        }
    };
    let _signals = cli
        .task
        .polls_interrupts()
        .then(host::install_signal_handlers);
    match cli.task.run() {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            match host::interrupted() {
                Some(sig) => ExitCode::from(128 + sig as u8),
                None => failure_status(&task_name),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    /// `cargo xtask ARGS...` as the task it names, for the tests of each task's arguments.
    pub(crate) fn parse(args: &[&str]) -> Result<Task, clap::Error> {
        Cli::try_parse_from(std::iter::once("xtask").chain(args.iter().copied())).map(|c| c.task)
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_task_has_a_name_and_a_description() {
        let cli = Cli::command();
        let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
        assert_eq!(
            names,
            [
                "test",
                "bench",
                "compat",
                "dist",
                "rootfs",
                "vm-build",
                "vm-run",
                "vm-test",
                "vm-check",
                "vm-matrix"
            ]
        );
        for task in cli.get_subcommands() {
            assert!(task.get_about().is_some(), "{}", task.get_name());
            assert!(task.get_long_about().is_some(), "{}", task.get_name());
        }
    }

    #[test]
    fn lane_tasks_take_lanes_only() {
        for name in ["vm-build", "vm-check", "vm-matrix"] {
            assert!(parse(&[name]).is_ok());
            assert!(parse(&[name, "--lane", "v1", "--lane", "all"]).is_ok());
            assert!(parse(&[name, "--lane", "nosuch"]).is_err());
            assert!(parse(&[name, "extra"]).is_err());
            assert!(parse(&[name, "--bogus"]).is_err());
        }
        assert!(parse(&[]).is_err());
        assert!(parse(&["nosuch"]).is_err());
    }

    #[test]
    fn failures_of_the_vm_lane_exit_125() {
        for (task, code) in [
            ("vm-run", vm::EXIT_VM_FAILED as u8),
            ("vm-test", 125),
            ("vm-check", 125),
            ("vm-matrix", 125),
            ("vm-build", 1),
            ("rootfs", 1),
            ("nosuch", 1),
        ] {
            assert_eq!(failure_status(task), ExitCode::from(code), "{task}");
        }
    }
}
