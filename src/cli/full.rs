//! The two binaries of the command line. `codecage` runs a sandbox without loading the
//! server: the commands only `codecage-full` links (`Full` in the parent module: serve, mcp,
//! audit, image, openapi) it hands over by executing `codecage-full` with its own
//! arguments. The server's code made the one binary eight times larger, and every
//! `codecage run` paid for relocating and faulting in what it never calls (issue 27).

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// The build both binaries (and the init) come from: `codecage` hands it over, so a
/// `codecage-full` of another install does not run the command under another build's
/// meaning of the flags.
const FRONT_BUILD: &str = "CODECAGE_FRONT_BUILD";
const BUILD: &str = env!("CODECAGE_BUILD_ID");

/// `name` beside this binary (as cargo builds them) or in `../libexec/codecage/` (as the
/// Debian package installs `codecage-init` and `codecage-full`).
pub(super) fn companion(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(name), dir.join("../libexec/codecage").join(name)]
        .into_iter()
        .find(|p| p.is_file())
}

/// Executes `codecage-full` with this process's arguments, for `command`; returns only if
/// it cannot.
#[allow(dead_code)] // `codecage`'s alone
pub(super) fn exec(command: &str) -> i32 {
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "codecage".into());
    let Some(full) = companion("codecage-full") else {
        let here = std::env::current_exe().unwrap_or_default();
        eprintln!(
            "codecage: `{command}` is in codecage-full, which is installed neither beside {} nor \
             in ../libexec/codecage/ from it: install codecage and codecage-full from one build",
            here.display()
        );
        return codecage::outcome::ErrorKind::Setup.exit_status();
    };
    let error = std::process::Command::new(&full)
        .arg0(arg0)
        .args(args)
        .env(FRONT_BUILD, BUILD)
        .exec();
    eprintln!("codecage: cannot execute {}: {error}", full.display());
    codecage::outcome::ErrorKind::Setup.exit_status()
}

/// In `codecage-full`: refuses a `codecage` of another build (run directly, there is none).
pub(super) fn check_front() -> Result<(), String> {
    match std::env::var(FRONT_BUILD) {
        Ok(theirs) if theirs != BUILD => Err(format!(
            "{} (build {BUILD}) was started by a codecage of another build ({theirs}): \
             install codecage, codecage-full and codecage-init from one build",
            std::env::current_exe().unwrap_or_default().display()
        )),
        _ => Ok(()),
    }
}
