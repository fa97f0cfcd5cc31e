//! `codecage audit list|show|export|prune`: the audit log, read from its database.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};

use crate::audit::{self, Filter, Store};

#[derive(Args)]
pub struct AuditArgs {
    /// The database (default: the [audit] path of --config, else of
    /// /etc/codecage/config.toml, else /var/lib/codecage/audit/audit.db).
    #[arg(long, value_name = "PATH", global = true)]
    db: Option<PathBuf>,
    /// A server configuration whose [audit] section names the database and the retention.
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Subcommand)]
enum AuditCommand {
    /// The newest records, one line each (code and output: see `show`).
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One record, whole, as JSON.
    Show {
        /// The record's id (from `list`).
        id: String,
    },
    /// Every record the filters select, oldest first, one JSON object per line.
    Export {
        #[command(flatten)]
        filter: FilterArgs,
        /// The format: jsonl (JSON Lines).
        #[arg(long, default_value = "jsonl", value_parser = ["jsonl"])]
        format: String,
    },
    /// Deletes the records past the retention (audit.retention_days, default 30).
    Prune {
        /// Delete what started before this instead (a time, or a duration back: 7d).
        #[arg(long, value_name = "T")]
        before: Option<String>,
    },
}

#[derive(Args)]
struct FilterArgs {
    /// Started at or after T: RFC 3339 (2026-11-26T05:00:00Z), a date (2026-11-26), or a
    /// duration back from now (24h, 7d, 30m).
    #[arg(long, value_name = "T")]
    since: Option<String>,
    /// Started before T (as --since).
    #[arg(long, value_name = "T")]
    until: Option<String>,
    /// Under this profile.
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// With this error kind (timeout, oom, policy, invalid_request, unauthorized, ...), or
    /// `none`.
    #[arg(long, value_name = "KIND")]
    error: Option<String>,
    /// Of this session (its life, calls and resets).
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Of this kind: run, call, session, reset, process, refused, approval.
    #[arg(long, value_name = "KIND")]
    kind: Option<String>,
    /// By this caller (token:NAME, uid:N, unauthenticated).
    #[arg(long, value_name = "WHO")]
    caller: Option<String>,
    /// With this status: running, complete, incomplete.
    #[arg(long, value_name = "STATUS")]
    status: Option<String>,
}

impl FilterArgs {
    fn filter(self, limit: Option<u64>) -> Result<Filter, String> {
        let now = SystemTime::now();
        let time = |t: Option<String>, flag: &str| {
            t.map(|t| {
                audit::time::parse(&t, now)
                    .map(audit::time::millis)
                    .map_err(|e| format!("--{flag}: {e}"))
            })
            .transpose()
        };
        Ok(Filter {
            since: time(self.since, "since")?,
            until: time(self.until, "until")?,
            profile: self.profile,
            error: self.error,
            session: self.session,
            kind: self.kind,
            caller: self.caller,
            status: self.status,
            limit,
        })
    }
}

pub fn main(args: AuditArgs) -> i32 {
    match run(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("codecage: {e}");
            1
        }
    }
}

/// The [audit] section that applies: --config's, else the host config's, else defaults.
fn settings(args: &AuditArgs) -> Result<audit::AuditConfig, String> {
    let mut config = match &args.config {
        Some(file) => crate::server::ServerConfig::load(file)?.audit,
        None => crate::host_config::HostConfig::load()?
            .audit
            .unwrap_or_default(),
    };
    if let Some(db) = &args.db {
        config.path = db.clone();
    }
    Ok(config)
}

fn run(args: AuditArgs) -> Result<(), String> {
    let config = settings(&args)?;
    let mut store = Store::open_existing(&config.path).map_err(|e| match config.path.exists() {
        true => e,
        false => format!("{e}; give --db PATH for another"),
    })?;
    let failed = |e: rusqlite::Error| format!("audit database {}: {e}", config.path.display());
    let out = |line: String| {
        use std::io::Write;
        // A reader that went away (`| head`) ends the listing, quietly.
        writeln!(std::io::stdout(), "{line}").is_ok()
    };
    match args.command {
        AuditCommand::List {
            filter,
            limit,
            json,
        } => {
            let records = store
                .query(&filter.filter(Some(limit.max(1)))?, false)
                .map_err(failed)?;
            if json {
                for r in &records {
                    if !out(serde_json::to_string(r).unwrap_or_default()) {
                        break;
                    }
                }
                return Ok(());
            }
            out(format!(
                "{:<32}  {:<24}  {:<8}  {:<10}  {:<18}  {:<10}  {:<16}  {:>9}",
                "ID", "STARTED", "KIND", "STATUS", "CALLER", "PROFILE", "ERROR", "MS"
            ));
            for r in &records {
                let line = format!(
                    "{:<32}  {:<24}  {:<8}  {:<10}  {:<18}  {:<10}  {:<16}  {:>9}",
                    r.id,
                    r.started_at,
                    r.kind,
                    r.status,
                    r.caller,
                    r.profile.as_deref().unwrap_or("-"),
                    r.error.as_deref().unwrap_or("-"),
                    r.duration_ms.map_or("-".into(), |d| format!("{d:.1}")),
                );
                if !out(line) {
                    break;
                }
            }
            Ok(())
        }
        AuditCommand::Show { id } => {
            let record = store.get(&id).map_err(failed)?.ok_or_else(|| {
                format!("there is no audit record {id} in {}", config.path.display())
            })?;
            out(serde_json::to_string_pretty(&record).unwrap_or_default());
            Ok(())
        }
        AuditCommand::Export { filter, .. } => {
            for r in store.query(&filter.filter(None)?, true).map_err(failed)? {
                if !out(serde_json::to_string(&r).unwrap_or_default()) {
                    break;
                }
            }
            Ok(())
        }
        AuditCommand::Prune { before } => {
            let now = SystemTime::now();
            let before = match before {
                Some(t) => audit::time::parse(&t, now).map_err(|e| format!("--before: {e}"))?,
                None => now - Duration::from_secs(config.retention_days * 24 * 3600),
            };
            let n = store.prune(audit::time::millis(before)).map_err(failed)?;
            eprintln!(
                "codecage: deleted {n} audit records that started before {}",
                audit::time::show(audit::time::millis(before))
            );
            Ok(())
        }
    }
}
