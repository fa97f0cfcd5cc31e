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
    eprintln!(
        "codecage: {}",
        exec_full(&format!("`{command}` is in codecage-full"))
    );
    codecage::outcome::ErrorKind::Setup.exit_status()
}

/// Whether this binary is linked against glibc's static libc, as `cargo xtask dist` (and
/// `bench`) link `codecage`: ~0.5 ms less for every run (no dynamic loader, no libraries
/// to map and relocate, none of their symbols to bind). A static glibc still answers
/// questions about users, groups and host names (NSS) by loading the modules nsswitch.conf
/// names, and those link libc.so, whose second copy in a static process can crash it (seen:
/// `group: files systemd`, getgrouplist, SIGSEGV). So a static `codecage` never asks: what
/// would ask, it hands to `codecage-full` (always dynamic) before it has read any input
/// or started anything: a run through sudo by another user that reads or writes their
/// files (their groups; any other run knows only the caller's ids), the server's clients
/// (a server named by host name), a run that writes an audit log for a group (its gid) or
/// whose network mode has a gateway (the gateway resolves names), and a run whose profile
/// or host config is a pipe it could not leave unread. `doctor` and `profiles` ask
/// nothing. [`name_service`] is the backstop at each place that would ask, and `Caller`
/// refuses to act as a user whose groups were not looked up. (musl's static libc loads no
/// such modules.)
pub(crate) const STATIC: bool = cfg!(all(target_env = "gnu", target_feature = "crt-static"));

/// In a static `codecage`, hands this command to `codecage-full`, `why` naming what made it
/// theirs; returns only if it cannot, with what went wrong.
pub(crate) fn hand_over(why: &str) -> String {
    exec_full(&format!(
        "{why}, so this statically linked codecage hands it to codecage-full"
    ))
}

/// In a static `codecage`, refuses `what`, which would ask the host's name service: the
/// command should have been handed to `codecage-full` before it got here ([`STATIC`]).
pub(crate) fn name_service(what: &str) -> Result<(), String> {
    if STATIC {
        return Err(format!(
            "{what} needs the host's name service (NSS), which a statically linked codecage never \
             asks (it would load the modules' libc.so beside its own): codecage-full does; this \
             command should have been handed to it (a bug: please report it)"
        ));
    }
    Ok(())
}

/// Whether this process runs for a sudo caller other than root, whose groups
/// `Caller::from_sudo` would ask the name service for.
pub(crate) fn sudo_caller() -> bool {
    std::env::var_os("SUDO_UID").is_some_and(|uid| uid != "0")
}

/// Executes `codecage-full` with this process's arguments; returns only if it cannot, with
/// what went wrong (`what` names why it was to run).
fn exec_full(what: &str) -> String {
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "codecage".into());
    let Some(full) = companion("codecage-full") else {
        let here = std::env::current_exe().unwrap_or_default();
        return format!(
            "{what}, which is installed neither beside {} nor in ../libexec/codecage/ from it: \
             install codecage and codecage-full from one build",
            here.display()
        );
    };
    let error = std::process::Command::new(&full)
        .arg0(arg0)
        .args(args)
        .env(FRONT_BUILD, BUILD)
        .exec();
    format!("{what}: cannot execute {}: {error}", full.display())
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
