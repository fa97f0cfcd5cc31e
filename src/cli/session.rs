//! `codecage session ...`: sessions from the shell, through `codecage serve`.

use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::client::{self, Server};
use codecage::outcome::ErrorKind;

#[derive(Args)]
pub struct SessionArgs {
    /// The server: unix:PATH or http://HOST:PORT (default: $CODECAGE_SERVER, else
    /// unix:/run/codecage/codecage.sock).
    #[arg(long, global = true, value_name = "unix:PATH|URL")]
    server: Option<String>,
    /// A bearer token for a TCP server (default: $CODECAGE_TOKEN).
    #[arg(long, global = true, value_name = "TOKEN")]
    token: Option<String>,
    #[command(subcommand)]
    command: SessionCommand,
}

#[derive(Subcommand)]
enum SessionCommand {
    /// Create a session; its id is the last line printed.
    Create {
        #[arg(long, value_parser = parse_lang, value_name = "LANG")]
        lang: codecage::runner::Lang,
        /// A profile by name (default: the language's).
        #[arg(long)]
        profile: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Run code in a session and print its output (exit status 1 on an exception).
    Exec {
        id: String,
        #[arg(short = 'c', value_name = "CODE")]
        code: String,
        /// This call's time limit (30, 30s, 500ms).
        #[arg(long, value_name = "DURATION")]
        timeout: Option<String>,
        /// Text the code reads on stdin.
        #[arg(long)]
        stdin: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// A fresh interpreter in the same sandbox (/work is kept).
    Reset { id: String },
    /// Interrupt the session's running call.
    Interrupt { id: String },
    /// Close a session.
    Close { id: String },
    /// List the live sessions (JSON).
    List,
}

fn parse_lang(text: &str) -> Result<codecage::runner::Lang, String> {
    text.parse()
}

pub fn main(args: SessionArgs) -> i32 {
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
            body.as_ref(),
            token.as_deref(),
        ))
    };
    let result = match args.command {
        SessionCommand::Create {
            lang,
            profile,
            json,
        } => {
            let mut body = json!({ "language": lang.name() });
            if let Some(p) = profile {
                body["profile"] = json!(p);
            }
            call("POST", "/v1/sessions".into(), Some(body)).map(|answer| {
                ok_or_report(answer.status, &answer.body, |v| {
                    if json {
                        println!("{v}");
                    } else {
                        println!("{}", v["id"].as_str().unwrap_or_default());
                    }
                    0
                })
            })
        }
        SessionCommand::Exec {
            id,
            code,
            timeout,
            stdin,
            json,
        } => {
            let mut body = json!({ "code": code });
            if let Some(t) = timeout {
                body["timeout"] = json!(t);
            }
            if let Some(s) = stdin {
                body["stdin"] = json!(s);
            }
            call("POST", format!("/v1/sessions/{id}/execute"), Some(body)).map(|answer| {
                ok_or_report(answer.status, &answer.body, |v| {
                    if json {
                        println!("{v}");
                    } else {
                        print_call(v);
                    }
                    exit_status(v)
                })
            })
        }
        SessionCommand::Reset { id } => call("POST", format!("/v1/sessions/{id}/reset"), None)
            .map(|a| ok_or_report(a.status, &a.body, |_| 0)),
        SessionCommand::Interrupt { id } => {
            call("POST", format!("/v1/sessions/{id}/interrupt"), None)
                .map(|a| ok_or_report(a.status, &a.body, |_| 0))
        }
        SessionCommand::Close { id } => call("DELETE", format!("/v1/sessions/{id}"), None)
            .map(|a| ok_or_report(a.status, &a.body, |_| 0)),
        SessionCommand::List => call("GET", "/v1/sessions".into(), None).map(|answer| {
            ok_or_report(answer.status, &answer.body, |v| {
                println!("{v}");
                0
            })
        }),
    };
    match result {
        Ok(status) => status,
        Err(e) => {
            eprintln!("codecage: {e}");
            125
        }
    }
}

/// A 2xx answer goes to `then`; anything else prints the server's message.
fn ok_or_report(status: u16, body: &[u8], then: impl FnOnce(&Value) -> i32) -> i32 {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        return then(&value);
    }
    let message = value["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).to_string());
    eprintln!("codecage: {message} (HTTP {status})");
    if status == 404 || status == 409 {
        1
    } else {
        125
    }
}

fn print_call(v: &Value) {
    use base64::Engine as _;
    for (field, mut out) in [
        ("stdout", Box::new(std::io::stdout()) as Box<dyn Write>),
        ("stderr", Box::new(std::io::stderr())),
    ] {
        let text = v[field].as_str().unwrap_or_default();
        let bytes = if v[format!("{field}_encoding")] == "base64" {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .unwrap_or_default()
        } else {
            text.as_bytes().to_vec()
        };
        let _ = out.write_all(&bytes);
        let _ = out.flush();
    }
    if let Some(result) = v["result"]["text/plain"].as_str() {
        println!("{result}");
    }
    for display in v["displays"].as_array().into_iter().flatten() {
        let kinds: Vec<&str> = display
            .as_object()
            .map_or(Vec::new(), |m| m.keys().map(String::as_str).collect());
        println!("[display: {}]", kinds.join(", "));
    }
    if let Some(e) = v["exception"].as_object() {
        for line in e["traceback"].as_array().into_iter().flatten() {
            eprint!("{}", line.as_str().unwrap_or_default());
        }
    } else if let Some(message) = v["message"].as_str() {
        eprintln!("codecage: {message}");
    }
}

/// The shell's conventions: 1 on an exception, 124 on a timeout, the call's own status
/// (bash), else 0.
fn exit_status(v: &Value) -> i32 {
    let kind: Option<ErrorKind> = serde_json::from_value(v["error"].clone()).ok();
    match kind {
        Some(kind) => kind.exit_status(),
        None => v["exit_code"].as_i64().map_or(0, |c| c as i32),
    }
}
