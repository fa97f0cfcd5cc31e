//! Developer tasks: `cargo xtask <task>`.
//!
//! * `test`: the project's test command (see `src/test.rs`).
//! * `vm-build`, `vm-run`, `vm-test`, `vm-check`: the cgroup-v2 VM test lane
//!   (see `src/vm/mod.rs` and `vm/README.md`).

mod bench;
mod host;
mod rootfs;
mod test;
mod vm;

use std::io::Write as _;
use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <task> [args]

tasks:
  test       run the unit and integration tests (root):   test [-- NEXTEST-ARGS...]
  bench      start-up, layer cost and throughput against bare, bubblewrap and crun (root)
  rootfs     build the sandbox root filesystem image (root; instant when up to date):
             rootfs [--recipe NAME] [--out DIR] [--force] [--verify]
  vm-build   build the cgroup-v2 VM image (root; cached, instant when up to date)
  vm-run     run a command in the VM:   vm-run [--timeout S] [--share DIR] [--env K=V]... -- CMD...
  vm-test    run the integration tests in the VM:   vm-test [--release] [-- TEST-ARGS...]
  vm-check   boot the VM and show its cgroup/landlock layout

`cargo xtask <task> --help` describes a task.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    if matches!(rest.first().map(String::as_str), Some("-h" | "--help")) {
        let usage = match task.as_str() {
            "test" => test::USAGE,
            "bench" => bench::USAGE,
            "rootfs" => rootfs::USAGE,
            "vm-build" => vm::build::USAGE,
            "vm-run" => vm::run::USAGE,
            "vm-test" => vm::lane::TEST_USAGE,
            "vm-check" => vm::lane::CHECK_USAGE,
            _ => USAGE,
        };
        let _ = writeln!(std::io::stdout(), "{usage}");
        return ExitCode::SUCCESS;
    }
    // The VM tasks poll for interrupts so that they can kill QEMU or mmdebstrap and
    // clean up; other tasks keep the default behaviour (rootfs installs its own).
    let _signals = (task.starts_with("vm-") || task == "test").then(host::install_signal_handlers);
    let result = match task.as_str() {
        "test" => test::test(rest),
        "bench" => bench::main(rest),
        "rootfs" => rootfs::main(rest),
        "vm-build" => match rest.first() {
            None => vm::build::build().map(|_| 0),
            Some(a) => Err(anyhow::anyhow!(
                "vm-build takes no arguments (got {a:?})\n\n{}",
                vm::build::USAGE
            )),
        },
        "vm-run" => vm::run::parse_args(rest).and_then(|opts| {
            let image = vm::ensure_image()?;
            vm::run::run(&image, &opts)
        }),
        "vm-test" => vm::lane::vm_test(rest),
        "vm-check" => vm::lane::vm_check(rest),
        "-h" | "--help" | "help" => {
            let _ = writeln!(std::io::stdout(), "{USAGE}");
            Ok(0)
        }
        other => Err(anyhow::anyhow!("unknown task {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            if let Some(sig) = vm::interrupted() {
                return ExitCode::from(128 + sig as u8);
            }
            ExitCode::from(if task.starts_with("vm-") && task != "vm-build" {
                vm::EXIT_VM_FAILED as u8
            } else {
                1
            })
        }
    }
}
