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
        /// The session's context to run in: python, node, typescript, bash (default: the
        /// session's language). Each is made on first use, in the same sandbox.
        #[arg(long, value_parser = parse_lang, value_name = "LANG")]
        lang: Option<codecage::runner::Lang>,
        /// This call's time limit (30, 30s, 500ms).
        #[arg(long, value_name = "DURATION")]
        timeout: Option<String>,
        /// Text the code reads on stdin.
        #[arg(long)]
        stdin: Option<String>,
        /// Place the host file SRC at /work/DEST before the code runs. Repeatable.
        #[arg(long = "file", value_name = "DEST=SRC")]
        files: Vec<String>,
        /// Write the call's output files (new or changed under the profile's outputs.dir)
        /// under DIR.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Upload the host file SRC to /work/DEST in the session (DEST defaults to SRC's name).
    Put {
        id: String,
        src: std::path::PathBuf,
        dest: Option<String>,
    },
    /// Download /work/PATH from the session to DEST (default: standard output).
    Get {
        id: String,
        path: String,
        dest: Option<std::path::PathBuf>,
    },
    /// List a directory under /work in the session (default: /work itself).
    Ls {
        id: String,
        #[arg(default_value = "")]
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Fresh interpreters in the same sandbox (/work is kept): every context and background
    /// process, or with --lang that context only.
    Reset {
        id: String,
        #[arg(long, value_parser = parse_lang, value_name = "LANG")]
        lang: Option<codecage::runner::Lang>,
    },
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
    let caller = codecage::caller::Caller::from_sudo();
    let send = |method: &str, path: String, body: client::Body| {
        runtime.block_on(client::request(
            &server,
            method,
            &path,
            body,
            token.as_deref(),
        ))
    };
    let call = |method: &str, path: String, body: Option<Value>| {
        send(
            method,
            path,
            body.map_or(client::Body::None, client::Body::Json),
        )
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
            lang,
            timeout,
            stdin,
            files,
            out_dir,
            json,
        } => {
            let mut body = json!({ "code": code });
            if let Some(lang) = lang {
                body["language"] = json!(lang.name());
            }
            if let Some(t) = timeout {
                body["timeout"] = json!(t);
            }
            if let Some(s) = stdin {
                body["stdin"] = json!(s);
            }
            let mut inputs = Vec::new();
            for item in &files {
                match super::run::read_input(item, caller.as_ref()) {
                    Ok(file) => inputs.push(file),
                    Err(e) => {
                        eprintln!("codecage: {e}");
                        return 125;
                    }
                }
            }
            if !inputs.is_empty() {
                body["files"] = json!(inputs);
            }
            if out_dir.is_none() {
                body["file_data"] = json!(false);
            }
            call("POST", format!("/v1/sessions/{id}/execute"), Some(body)).map(|answer| {
                ok_or_report(answer.status, &answer.body, |v| {
                    let mut v = v.clone();
                    if let Some(dir) = &out_dir {
                        save_call_outputs(&mut v, dir, caller.as_ref());
                    }
                    if json {
                        println!("{v}");
                    } else {
                        print_call(&v);
                    }
                    exit_status(&v)
                })
            })
        }
        SessionCommand::Put { id, src, dest } => {
            let dest =
                match dest.or_else(|| src.file_name().map(|n| n.to_string_lossy().into_owned())) {
                    Some(d) => d,
                    None => {
                        eprintln!("codecage: {} has no file name: give DEST", src.display());
                        return 125;
                    }
                };
            let read = match &caller {
                Some(c) => c.read(&src),
                None => std::fs::read(&src),
            };
            let bytes = match read {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("codecage: cannot read {}: {e}", src.display());
                    return 125;
                }
            };
            let dest = dest.trim_start_matches("/work/").to_string();
            send(
                "PUT",
                format!("/v1/sessions/{id}/files/{}", encode_path(&dest)),
                client::Body::Bytes(bytes),
            )
            .map(|a| ok_or_report(a.status, &a.body, |_| 0))
        }
        SessionCommand::Get { id, path, dest } => {
            let path = path.trim_start_matches("/work/").to_string();
            send(
                "GET",
                format!("/v1/sessions/{id}/files/{}", encode_path(&path)),
                client::Body::None,
            )
            .map(|answer| {
                if !(200..300).contains(&answer.status) {
                    return ok_or_report(answer.status, &answer.body, |_| 0);
                }
                let written = match dest {
                    None => std::io::stdout()
                        .write_all(&answer.body)
                        .map_err(|e| e.to_string()),
                    Some(dest) => {
                        let bytes = answer.body;
                        let target = dest.clone();
                        let write = move || {
                            std::fs::write(&target, &bytes)
                                .map_err(|e| format!("cannot write {}: {e}", target.display()))
                        };
                        match &caller {
                            Some(c) => c.as_user(write),
                            None => write(),
                        }
                    }
                };
                match written {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("codecage: {e}");
                        125
                    }
                }
            })
        }
        SessionCommand::Ls { id, path, json } => {
            let path = path.trim_start_matches("/work").trim_start_matches('/');
            send(
                "GET",
                format!("/v1/sessions/{id}/files?path={}", encode_path(path)),
                client::Body::None,
            )
            .map(|answer| {
                ok_or_report(answer.status, &answer.body, |v| {
                    if json {
                        println!("{v}");
                        return 0;
                    }
                    for entry in v.as_array().into_iter().flatten() {
                        println!(
                            "{:<9} {:>10}  {}  {}",
                            entry["type"].as_str().unwrap_or("?"),
                            entry["size"].as_u64().unwrap_or(0),
                            entry["mtime"].as_str().unwrap_or(""),
                            entry["name"].as_str().unwrap_or("")
                        );
                    }
                    0
                })
            })
        }
        SessionCommand::Reset { id, lang } => call(
            "POST",
            match lang {
                Some(lang) => format!("/v1/sessions/{id}/reset?language={}", lang.name()),
                None => format!("/v1/sessions/{id}/reset"),
            },
            None,
        )
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

/// Percent-encodes a path for a URL, keeping its `/` separators.
fn encode_path(path: &str) -> String {
    let mut out = String::new();
    for byte in path.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// `exec --out-dir DIR`: writes the call's output files under DIR (as the caller, through
/// sudo), lists them on stderr, and drops their bytes from the printed object.
fn save_call_outputs(
    v: &mut Value,
    dir: &std::path::Path,
    caller: Option<&codecage::caller::Caller>,
) {
    let files: Vec<codecage::files::OutputFile> =
        serde_json::from_value(v["files"].clone()).unwrap_or_default();
    let target = dir.to_path_buf();
    let listed = files.clone();
    let saved = match caller {
        Some(c) => c.as_user(move || codecage::files::save_under(&target, &listed)),
        None => codecage::files::save_under(&target, &listed),
    };
    match saved {
        Ok(paths) => {
            for (file, path) in files.iter().zip(&paths) {
                eprintln!(
                    "codecage: wrote {} ({} bytes, {})",
                    path.display(),
                    file.size,
                    file.media_type
                );
            }
        }
        Err(e) => eprintln!("codecage: the output files could not be saved: {e}"),
    }
    for skipped in v["files_skipped"].as_array().into_iter().flatten() {
        eprintln!("codecage: skipped output {skipped}");
    }
    for file in v["files"].as_array_mut().into_iter().flatten() {
        if let Some(f) = file.as_object_mut() {
            f.remove("data");
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
