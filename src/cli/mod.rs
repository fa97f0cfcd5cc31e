//! The `codecage` command line. It parses and translates; the library decides.

mod approvals;
mod audit;
pub(crate) mod full;
#[cfg(feature = "image")]
mod image;
mod mcp;
mod run;
mod serve;
mod session;

use clap::{Parser, Subcommand};

use codecage::outcome::{ErrorKind, Outcome};

/// Run untrusted code in a Linux sandbox built from namespaces.
#[derive(Parser)]
#[command(name = "codecage", version, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Each subcommand's arguments are built only when it is the one given: a `codecage run` does
// not build the server's, the sessions' or the audit's (issue 27: the whole tree cost a
// run's start about half a millisecond).
#[command(defer = true)]
// Parsed once per process; boxing the big variant would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run code or a program in a new sandbox and wait for it.
    Run(run::RunArgs),
    /// List the profiles with their effective values.
    Profiles {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Show what this host supports, layer by layer (creates and removes one cgroup).
    Doctor {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Serve the HTTP API (a unix socket by default) until SIGTERM.
    Serve(serve::ServeArgs),
    /// Sessions with a persistent interpreter, through the server.
    Session(session::SessionArgs),
    /// Serve MCP over stdio (execute_python, execute_node, execute_shell, reset_repl, files)
    /// for an MCP client that starts codecage.
    Mcp(mcp::McpArgs),
    /// Print the server's OpenAPI document.
    Openapi,
    /// Read and prune the audit log: every run, session call and refusal.
    Audit(audit::AuditArgs),
    /// Commands waiting for a person's approval (a profile's `[exec] ask`): list, allow,
    /// deny; the standing rules: rules, revoke.
    Approvals(approvals::ApprovalsArgs),
    /// Build, list and verify the root filesystem images sandboxes run in.
    #[cfg(feature = "image")]
    Image(image::ImageArgs),
}

/// The commands whose code only `codecage-full` links: the server, MCP, the audit log's
/// reader (SQLite), the images and the OpenAPI document. `codecage` itself runs the rest
/// (`run`, `doctor`, `profiles`, and the server's clients `session` and `approvals`) and
/// executes `codecage-full` for these, so that a run does not load and relocate them.
enum Full {
    Serve(serve::ServeArgs),
    Mcp(mcp::McpArgs),
    Audit(audit::AuditArgs),
    #[cfg(feature = "image")]
    Image(image::ImageArgs),
    Openapi,
}

/// `codecage` (src/main.rs): runs the CLI, handing the commands of [`Full`] to
/// `codecage-full`; returns the process exit status.
// Each binary calls one of `main` and `main_full`: the other is dead code in it.
#[allow(dead_code)]
pub fn main() -> i32 {
    start();
    dispatch(|command| full::exec(command.name()))
}

/// `codecage-full` (src/bin/codecage-full.rs): runs every command itself; returns the
/// process exit status.
pub fn main_full() -> i32 {
    if let Err(message) = full::check_front() {
        eprintln!("codecage: {message}");
        return ErrorKind::Setup.exit_status();
    }
    if full::STATIC {
        // It is what a static `codecage` hands the name service's questions to.
        eprintln!(
            "codecage: codecage-full must be linked dynamically: it asks the host's name service \
             for the static codecage (build it without -C target-feature=+crt-static)"
        );
        return ErrorKind::Setup.exit_status();
    }
    start();
    dispatch(run_full)
}

/// What both binaries do before parsing: name the sandboxes' init.
fn start() {
    if let Some(init) = full::companion("codecage-init") {
        codecage::spec::set_default_init_exe(init);
    }
}

/// Parses the arguments and runs the command: those of [`Full`] through `full`. Both
/// binaries compile these modules, but only `codecage-full`'s `main` reaches [`main_full`]
/// and so `run_full`: rustc builds of a binary only what its `main` reaches, so the
/// server's code is not in `codecage`.
fn dispatch(full: fn(Full) -> i32) -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(err),
    };
    match cli.command {
        Command::Run(args) => run::main(args),
        Command::Doctor { json } => doctor(json),
        Command::Profiles { json } => profiles(json),
        // The server's clients may name it by host name: a static `codecage` would ask the
        // name service.
        Command::Session(_) | Command::Approvals(_) if full::STATIC => {
            eprintln!(
                "codecage: {}",
                full::hand_over("a client of the server may look up its host name (NSS)")
            );
            ErrorKind::Setup.exit_status()
        }
        Command::Session(args) => session::main(args),
        Command::Approvals(args) => approvals::main(args),
        Command::Serve(args) => full(Full::Serve(args)),
        Command::Mcp(args) => full(Full::Mcp(args)),
        Command::Audit(args) => full(Full::Audit(args)),
        #[cfg(feature = "image")]
        Command::Image(args) => full(Full::Image(args)),
        Command::Openapi => full(Full::Openapi),
    }
}

impl Full {
    #[allow(dead_code)] // `codecage`'s alone
    fn name(&self) -> &'static str {
        match self {
            Full::Serve(_) => "serve",
            Full::Mcp(_) => "mcp",
            Full::Audit(_) => "audit",
            #[cfg(feature = "image")]
            Full::Image(_) => "image",
            Full::Openapi => "openapi",
        }
    }
}

fn run_full(command: Full) -> i32 {
    match command {
        Full::Serve(args) => serve::main(args),
        Full::Mcp(args) => mcp::main(args),
        Full::Audit(args) => audit::main(args),
        #[cfg(feature = "image")]
        Full::Image(args) => image::main(args),
        Full::Openapi => {
            use std::io::Write;
            // A reader that went away (`| head`) is not our error to report.
            let _ = std::io::stdout().write_all(crate::server::openapi_document().as_bytes());
            0
        }
    }
}

fn profiles(json: bool) -> i32 {
    use codecage::knobs::Knob;
    use codecage::profile::{names, Profile};
    let mut loaded = serde_json::Map::new();
    let mut failed = false;
    for name in names() {
        match Profile::load(&name) {
            Ok(p) => {
                if !json {
                    println!("{name}: {}", p.description);
                    println!(
                        "  language {}, rootfs {}, network {:?}, landlock {:?}, seccomp {:?}, cgroup {:?}",
                        p.language.map_or("-", |l| l.name()),
                        p.rootfs,
                        p.network.mode,
                        p.hardening.landlock,
                        p.hardening.seccomp,
                        p.hardening.cgroup,
                    );
                    let knobs: Vec<String> = Knob::all()
                        .map(|k| match k.max_key() {
                            Some(_) => {
                                format!("{k} {} (max {})", k.show(p.value(k)), k.show(p.max(k)))
                            }
                            None => format!("{k} {}", k.show(p.value(k))),
                        })
                        .collect();
                    println!("  {}", knobs.join(", "));
                    println!("  env {:?}, output types {:?}", p.env, p.output_types);
                }
                loaded.insert(name, serde_json::to_value(&p).unwrap_or_default());
            }
            Err(e) => {
                failed = true;
                eprintln!("codecage: {e}");
            }
        }
    }
    if json {
        print_json_value(&serde_json::Value::Object(loaded));
    }
    i32::from(failed)
}

fn print_json_value(value: &serde_json::Value) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{value}");
}

fn doctor(json: bool) -> i32 {
    let report = codecage::doctor::probe();
    if json {
        print_json_value(&serde_json::to_value(&report).unwrap_or_default());
    } else {
        println!("kernel           {}", report.kernel);
        for check in &report.checks {
            let mark = if check.ok { "ok " } else { "NO " };
            println!("{mark} {:<20} {}", check.name, check.detail);
        }
        for skipped in &report.not_enforced {
            println!("not enforced here: {skipped}");
        }
    }
    if report.ok() {
        0
    } else {
        1
    }
}

/// Help and version go to stdout with status 0; anything else is a bad request: 125, as
/// `docker run` ends when its own arguments are wrong, and one JSON object with `--json`.
fn usage_error(err: clap::Error) -> i32 {
    use clap::error::ErrorKind as Kind;
    if matches!(
        err.kind(),
        Kind::DisplayHelp | Kind::DisplayVersion | Kind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = err.print();
        return if err.kind() == Kind::DisplayHelpOnMissingArgumentOrSubcommand {
            2
        } else {
            0
        };
    }
    let wants_json = std::env::args()
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    if wants_json {
        let message = err.render().to_string();
        let message = message.trim().trim_start_matches("error: ").to_string();
        print_json(&Outcome::failed(ErrorKind::InvalidRequest, message));
    } else {
        let _ = err.print();
    }
    ErrorKind::InvalidRequest.exit_status()
}

fn print_json(outcome: &Outcome) {
    use std::io::Write;
    match serde_json::to_string(outcome) {
        // A reader that went away (`| head`) is not our error to report.
        Ok(json) => drop(writeln!(std::io::stdout(), "{json}")),
        Err(e) => eprintln!("codecage: cannot encode the outcome as JSON: {e}"),
    }
}
