//! The `codecage` command line. It parses and translates; the library decides.

mod run;

use clap::{Parser, Subcommand};

use crate::outcome::{ErrorKind, Outcome};

/// Run untrusted code in a Linux sandbox built from namespaces.
#[derive(Parser)]
#[command(name = "codecage", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run code or a program in a new sandbox and wait for it.
    Run(run::RunArgs),
    /// Show what this host supports, layer by layer (creates and removes one cgroup).
    Doctor {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the CLI; returns the process exit status.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(err),
    };
    match cli.command {
        Command::Run(args) => run::main(args),
        Command::Doctor { json } => doctor(json),
    }
}

fn doctor(json: bool) -> i32 {
    let report = crate::doctor::probe();
    if json {
        use std::io::Write;
        let text = serde_json::to_string(&report).unwrap_or_default();
        let _ = writeln!(std::io::stdout(), "{text}");
    } else {
        println!("kernel           {}", report.kernel);
        for check in &report.checks {
            let mark = if check.ok { "ok " } else { "NO " };
            println!("{mark} {:<20} {}", check.name, check.detail);
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
