//! `codecage approvals ...`: the commands waiting for a person (`[exec] ask`) and the
//! standing approvals, through `codecage serve` (deciding and the rules need an
//! administrator: root on the unix socket, or a token with the admin role).

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};

use crate::client::{self, Server};

#[derive(Args)]
pub struct ApprovalsArgs {
    /// The server: unix:PATH or http://HOST:PORT (default: $CODECAGE_SERVER, else
    /// unix:/run/codecage/codecage.sock).
    #[arg(long, global = true, value_name = "unix:PATH|URL")]
    server: Option<String>,
    /// A bearer token for a TCP server (default: $CODECAGE_TOKEN).
    #[arg(long, global = true, value_name = "TOKEN")]
    token: Option<String>,
    #[command(subcommand)]
    command: ApprovalsCommand,
}

#[derive(Clone, Copy, ValueEnum)]
enum Scope {
    /// The session that asked.
    Session,
    /// Every session of the token (or uid) that asked.
    Token,
    /// Every session of the profile.
    Profile,
}

#[derive(Subcommand)]
enum ApprovalsCommand {
    /// The questions waiting (--all: also those decided in the last day).
    List {
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// One question, with its status and the process it started.
    Show { id: String },
    /// Approve: once, or --always (a rule for its programs, in --scope).
    #[command(alias = "approve")]
    Allow {
        id: String,
        /// Also add a standing rule: the same programs run without asking.
        #[arg(long)]
        always: bool,
        /// Where the rule applies (with --always; default session).
        #[arg(long, value_enum, requires = "always")]
        scope: Option<Scope>,
    },
    /// Refuse: the command never runs.
    Deny { id: String },
    /// The standing rules (allow-always).
    Rules {
        #[arg(long)]
        json: bool,
    },
    /// Remove a rule: the very next command is judged without it.
    Revoke { rule_id: String },
}

pub fn main(args: ApprovalsArgs) -> i32 {
    let server = match Server::choose(args.server.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("codecage: --server {e}");
            return 125;
        }
    };
    let token = args.token.or_else(|| std::env::var("CODECAGE_TOKEN").ok());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("codecage: cannot start the async runtime: {e}");
            return 125;
        }
    };
    let call = |method: &str, path: String, body: Option<Value>| {
        runtime.block_on(client::request(
            &server,
            method,
            &path,
            body.map_or(client::Body::None, client::Body::Json),
            token.as_deref(),
        ))
    };
    let answer = match &args.command {
        ApprovalsCommand::List { all, .. } => call("GET", format!("/v1/approvals?all={all}"), None),
        ApprovalsCommand::Show { id } => call("GET", format!("/v1/approvals/{id}"), None),
        ApprovalsCommand::Allow { id, always, scope } => {
            let mut body = json!({"decision": if *always { "allow-always" } else { "allow-once" }});
            if let Some(scope) = scope {
                body["scope"] = match scope {
                    Scope::Session => "session",
                    Scope::Token => "token",
                    Scope::Profile => "profile",
                }
                .into();
            }
            call("POST", format!("/v1/approvals/{id}"), Some(body))
        }
        ApprovalsCommand::Deny { id } => call(
            "POST",
            format!("/v1/approvals/{id}"),
            Some(json!({"decision": "deny"})),
        ),
        ApprovalsCommand::Rules { .. } => call("GET", "/v1/approvals/rules".into(), None),
        ApprovalsCommand::Revoke { rule_id } => {
            call("DELETE", format!("/v1/approvals/rules/{rule_id}"), None)
        }
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            eprintln!("codecage: {e}");
            return 125;
        }
    };
    let value: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
    if !(200..300).contains(&answer.status) {
        let message = value["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&answer.body).to_string());
        eprintln!("codecage: {message} (HTTP {})", answer.status);
        return if answer.status == 404 { 1 } else { 125 };
    }
    match &args.command {
        ApprovalsCommand::List { json: true, .. } | ApprovalsCommand::Rules { json: true } => {
            println!("{value:#}")
        }
        ApprovalsCommand::List { .. } => {
            let list = value.as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                eprintln!("(no approvals waiting)");
            }
            for a in list {
                println!(
                    "{}  {}  {}  session {}  by {}: {}\n    why: {}",
                    a["approval_id"].as_str().unwrap_or("?"),
                    a["status"].as_str().unwrap_or("?"),
                    a["what"].as_str().unwrap_or("?"),
                    a["session_id"].as_str().unwrap_or("?"),
                    a["asked_by"].as_str().unwrap_or("?"),
                    a["command"].as_str().unwrap_or(""),
                    a["reason"].as_str().unwrap_or(""),
                );
            }
        }
        ApprovalsCommand::Rules { .. } => {
            let list = value.as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                eprintln!("(no rules)");
            }
            for r in list {
                let what = r["program"]
                    .as_str()
                    .map(|p| format!("program {p}"))
                    .or_else(|| r["command"].as_str().map(|c| format!("command {c:?}")))
                    .unwrap_or_default();
                println!(
                    "{}  {} {}  {}  (by {} at {})",
                    r["rule_id"].as_str().unwrap_or("?"),
                    r["scope"].as_str().unwrap_or("?"),
                    r["applies_to"].as_str().unwrap_or("?"),
                    what,
                    r["created_by"].as_str().unwrap_or("?"),
                    r["created_at"].as_str().unwrap_or("?"),
                );
            }
        }
        ApprovalsCommand::Revoke { rule_id } => println!("revoked {rule_id}"),
        _ => {
            println!("{value:#}");
        }
    }
    0
}
