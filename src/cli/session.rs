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
    /// Run code in a session's interpreter (-c CODE) and print its output (exit status 1 on
    /// an exception); or run a command beside it (-- CMD...): its output, and its exit
    /// status when it ends within --yield-ms, else it goes on in the background (its
    /// process id is said; see ps, logs, kill).
    #[command(group(clap::ArgGroup::new("what").required(true).args(["code", "command"])))]
    Exec {
        id: String,
        #[arg(short = 'c', value_name = "CODE",
              conflicts_with_all = ["command", "background", "yield_ms", "cwd", "env", "pty"])]
        code: Option<String>,
        /// The session's context to run CODE in: python, node, typescript, bash (default:
        /// the session's language). Each is made on first use, in the same sandbox.
        #[arg(long, value_parser = parse_lang, value_name = "LANG", conflicts_with = "command")]
        lang: Option<codecage::runner::Lang>,
        /// This call's (or the command's) time limit (30, 30s, 500ms).
        #[arg(long, value_name = "DURATION")]
        timeout: Option<String>,
        /// Text the code reads on stdin.
        #[arg(long, conflicts_with = "command")]
        stdin: Option<String>,
        /// Place the host file SRC at /work/DEST before the code runs. Repeatable.
        #[arg(long = "file", value_name = "DEST=SRC", conflicts_with = "command")]
        files: Vec<String>,
        /// Write the call's output files (new or changed under the profile's outputs.dir)
        /// under DIR.
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        out_dir: Option<std::path::PathBuf>,
        /// The command goes to the background at once: print its process id.
        #[arg(long)]
        background: bool,
        /// Run the command on a terminal of COLSxROWS (default 80x24; `session screen`
        /// shows it, `session send-keys` types into it).
        #[arg(long, value_name = "COLSxROWS", num_args = 0..=1, default_missing_value = "80x24")]
        pty: Option<String>,
        /// How long to wait for the command before it goes on in the background, in ms
        /// (default 10000).
        #[arg(long, value_name = "MS")]
        yield_ms: Option<u64>,
        /// Where the command starts: relative to /work, or absolute (default /work).
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// A variable for the command's environment. Repeatable.
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        #[arg(long)]
        json: bool,
        /// The command: one word is a command line for bash -c (quote it), several are a
        /// program and its arguments.
        #[arg(last = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// List the session's processes (the commands `exec -- CMD` started).
    Ps {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Print a process's output (what its buffer keeps, or from --from); with --follow, until
    /// it ends, then exit with its status.
    Logs {
        id: String,
        pid: u64,
        /// Poll for more until the process ends: every byte once, in order.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Start at these byte offsets (STDOUT:STDERR, as `exec` says when a command goes to
        /// the background).
        #[arg(long, value_name = "STDOUT:STDERR")]
        from: Option<String>,
    },
    /// Send keys to a process, by tmux's names (Enter, C-c, C-d, Up, Tab, Escape, BSpace,
    /// PPage, F1, a character; modifiers C-, M-, S-), or --text, or --paste.
    SendKeys {
        id: String,
        pid: u64,
        keys: Vec<String>,
        /// Text typed as it is, after the keys.
        #[arg(long, value_name = "TEXT")]
        text: Option<String>,
        /// Text pasted (bracketed when the program asked for it), after the keys.
        #[arg(long, value_name = "TEXT")]
        paste: Option<String>,
        /// Enter after the rest.
        #[arg(long)]
        submit: bool,
    },
    /// Print a terminal's screen as it is now (a process started with --pty).
    Screen {
        id: String,
        pid: u64,
        #[arg(long)]
        json: bool,
    },
    /// Attach this terminal to a process: print its output as it comes (from now, or
    /// --from), forward what is typed to it, and exit with its status when it ends. On a
    /// process started with --pty, from a terminal: raw mode (every key goes to it, C-c
    /// included), its screen drawn first, its size following this terminal's; detach with
    /// C-p C-q. Otherwise stdin is forwarded a line at a time (end of input closes the
    /// process's stdin).
    Attach {
        id: String,
        pid: u64,
        /// Start at these byte offsets (STDOUT:STDERR; 0:0 for all its buffer keeps)
        /// rather than at its output's end now.
        #[arg(long, value_name = "STDOUT:STDERR")]
        from: Option<String>,
    },
    /// Kill a process (SIGKILL to its process group), or send it --signal.
    Kill {
        id: String,
        pid: u64,
        /// A signal's name (TERM, INT, HUP, ...) instead of KILL.
        #[arg(long, value_name = "NAME")]
        signal: Option<String>,
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
        /// List to this many levels (1: the directory's own entries), with each entry's
        /// path, permissions and owner.
        #[arg(long)]
        depth: Option<u32>,
        #[arg(long)]
        json: bool,
    },
    /// Describe an entry of /work (type, size, permissions, owner, time; a symlink's
    /// target, never followed). Works while a call runs.
    Stat {
        id: String,
        /// Relative to /work, or absolute under it (default: /work itself).
        #[arg(default_value = "")]
        path: String,
        #[arg(long)]
        json: bool,
    },
    /// Make a directory under /work, with its parents (`mkdir -p`).
    Mkdir { id: String, path: String },
    /// Move or rename an entry of /work; an existing DEST is refused unless --force.
    Mv {
        id: String,
        src: String,
        dest: String,
        /// Replace an existing DEST (a file, or an empty directory).
        #[arg(long, short)]
        force: bool,
    },
    /// Remove a file, a symlink (not its target) or a directory tree of /work.
    Rm { id: String, path: String },
    /// Print the events of a directory of /work as they happen (`create PATH`, `write`,
    /// `remove`, `rename`, `chmod`), until interrupted, --count events or --seconds.
    Watch {
        id: String,
        /// Relative to /work, or absolute under it (default: /work itself).
        #[arg(default_value = "")]
        path: String,
        /// Every directory under it too.
        #[arg(long, short)]
        recursive: bool,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<usize>,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<u64>,
        /// One JSON object a line.
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
            background,
            pty,
            yield_ms,
            cwd,
            env,
            json,
            command,
        } => {
            let Some(code) = code else {
                let mut body = match command.as_slice() {
                    [line] => json!({ "command": line }),
                    argv => json!({ "argv": argv }),
                };
                body["background"] = json!(background);
                if let Some(size) = pty {
                    let parsed = size
                        .split_once('x')
                        .and_then(|(c, r)| Some((c.parse::<u16>().ok()?, r.parse::<u16>().ok()?)));
                    let Some((cols, rows)) = parsed else {
                        eprintln!("codecage: --pty {size:?}: give COLSxROWS, e.g. 120x40");
                        return 125;
                    };
                    body["pty"] = json!({ "cols": cols, "rows": rows });
                }
                if let Some(ms) = yield_ms {
                    body["yield_ms"] = json!(ms);
                }
                if let Some(t) = timeout {
                    body["timeout"] = json!(t);
                }
                if let Some(dir) = cwd {
                    body["cwd"] = json!(dir);
                }
                let mut vars = serde_json::Map::new();
                for item in &env {
                    match item.split_once('=') {
                        Some((name, value)) if !name.is_empty() => {
                            vars.insert(name.into(), json!(value));
                        }
                        _ => {
                            eprintln!("codecage: --env {item:?}: give NAME=VALUE");
                            return 125;
                        }
                    }
                }
                body["env"] = Value::Object(vars);
                return report(
                    call("POST", format!("/v1/sessions/{id}/processes"), Some(body)).map(
                        |answer| {
                            ok_or_report(answer.status, &answer.body, |v| {
                                if json {
                                    println!("{v}");
                                } else if !(background && v["status"] == "running") {
                                    print_streams(v);
                                }
                                process_status(&id, v, background && !json)
                            })
                        },
                    ),
                );
            };
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
        SessionCommand::Ps { id, json } => {
            call("GET", format!("/v1/sessions/{id}/processes"), None).map(|answer| {
                ok_or_report(answer.status, &answer.body, |v| {
                    if json {
                        println!("{v}");
                        return 0;
                    }
                    println!(
                        "{:>5}  {:<22} {:>9} {:>10}  COMMAND",
                        "PID", "STATUS", "TIME", "OUTPUT"
                    );
                    for p in v.as_array().into_iter().flatten() {
                        let seconds = p["duration_ms"].as_u64().unwrap_or(0) as f64 / 1000.0;
                        let output = p["stdout_cursor"].as_u64().unwrap_or(0)
                            + p["stderr_cursor"].as_u64().unwrap_or(0);
                        println!(
                            "{:>5}  {:<22} {:>8.1}s {:>10}  {}",
                            p["process_id"].as_u64().unwrap_or(0),
                            status_words(p),
                            seconds,
                            codecage::units::format_size(output),
                            p["command"].as_str().unwrap_or("").replace('\n', "\\n")
                        );
                    }
                    0
                })
            })
        }
        SessionCommand::Logs {
            id,
            pid,
            follow,
            from,
        } => {
            let mut cursor = match from.as_deref().map(parse_cursor) {
                None => (0, 0),
                Some(Ok(c)) => c,
                Some(Err(e)) => {
                    eprintln!("codecage: --from {e}");
                    return 125;
                }
            };
            loop {
                let path = format!(
                    "/v1/sessions/{id}/processes/{pid}?stdout_from={}&stderr_from={}",
                    cursor.0, cursor.1
                );
                let answer = match call("GET", path, None) {
                    Ok(a) => a,
                    Err(e) => break Err(e),
                };
                let mut done = None;
                let status = ok_or_report(answer.status, &answer.body, |v| {
                    print_streams(v);
                    for stream in ["stdout", "stderr"] {
                        let dropped = v[format!("{stream}_dropped")].as_u64().unwrap_or(0);
                        if dropped > 0 {
                            eprintln!(
                                "codecage: {dropped} bytes of {stream} were dropped before this (the \
                                 buffer keeps the last 1 MiB)"
                            );
                        }
                    }
                    cursor = (
                        v["stdout_cursor"].as_u64().unwrap_or(cursor.0),
                        v["stderr_cursor"].as_u64().unwrap_or(cursor.1),
                    );
                    if v["status"] != "running" {
                        done = Some(process_status(&id, v, false));
                    }
                    0
                });
                if status != 0 {
                    break Ok(status);
                }
                match (follow, done) {
                    (true, Some(status)) => break Ok(status),
                    (true, None) => std::thread::sleep(std::time::Duration::from_millis(250)),
                    (false, _) => break Ok(0),
                }
            }
        }
        SessionCommand::SendKeys {
            id,
            pid,
            keys,
            text,
            paste,
            submit,
        } => {
            if keys.is_empty() && text.is_none() && paste.is_none() && !submit {
                eprintln!("codecage: give keys (e.g. C-c, Up Enter), --text, --paste or --submit");
                return 125;
            }
            let mut body = json!({ "keys": keys, "submit": submit });
            if let Some(t) = text {
                body["data"] = json!(t);
            }
            if let Some(p) = paste {
                body["paste"] = json!(p);
            }
            call(
                "POST",
                format!("/v1/sessions/{id}/processes/{pid}/stdin"),
                Some(body),
            )
            .map(|a| ok_or_report(a.status, &a.body, |_| 0))
        }
        SessionCommand::Screen { id, pid, json } => call(
            "GET",
            format!("/v1/sessions/{id}/processes/{pid}/screen"),
            None,
        )
        .map(|a| {
            ok_or_report(a.status, &a.body, |v| {
                if json {
                    println!("{v}");
                    return 0;
                }
                let rows: Vec<&str> = v["rows"]
                    .as_array()
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let cursor_row = v["cursor"]["row"].as_u64().unwrap_or(0) as usize;
                let last = rows
                    .iter()
                    .rposition(|r| !r.is_empty())
                    .map_or(0, |i| i + 1)
                    .max(cursor_row + 1)
                    .min(rows.len());
                for row in &rows[..last] {
                    println!("{row}");
                }
                0
            })
        }),
        SessionCommand::Attach { id, pid, from } => {
            let from = match from.as_deref().map(parse_cursor) {
                None => None,
                Some(Ok(c)) => Some(c),
                Some(Err(e)) => {
                    eprintln!("codecage: --from {e}");
                    return 125;
                }
            };
            attach(&server, token.as_deref(), &call, &id, pid, from)
        }
        SessionCommand::Kill { id, pid, signal } => {
            let path = format!("/v1/sessions/{id}/processes/{pid}");
            let sent = match signal {
                None => call("DELETE", path, None),
                Some(name) => call(
                    "POST",
                    format!("{path}/signal"),
                    Some(json!({ "signal": name })),
                ),
            };
            sent.map(|a| ok_or_report(a.status, &a.body, |_| 0))
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
        SessionCommand::Ls {
            id,
            path,
            depth: Some(depth),
            json,
        } => call(
            "GET",
            format!(
                "/v1/sessions/{id}/fs/list?path={}&depth={depth}",
                encode_path(&path)
            ),
            None,
        )
        .map(|answer| {
            ok_or_report(answer.status, &answer.body, |v| {
                if json {
                    println!("{v}");
                } else {
                    v.as_array()
                        .into_iter()
                        .flatten()
                        .for_each(|e| println!("{}", entry_line(e)));
                }
                0
            })
        }),
        SessionCommand::Ls { id, path, json, .. } => {
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
        SessionCommand::Stat { id, path, json } => call(
            "GET",
            format!("/v1/sessions/{id}/fs/stat?path={}", encode_path(&path)),
            None,
        )
        .map(|answer| {
            ok_or_report(answer.status, &answer.body, |v| {
                if json {
                    println!("{v}");
                } else {
                    println!("{}", entry_line(v));
                }
                0
            })
        }),
        SessionCommand::Mkdir { id, path } => call(
            "POST",
            format!("/v1/sessions/{id}/fs/mkdir"),
            Some(json!({ "path": path })),
        )
        .map(|answer| {
            ok_or_report(answer.status, &answer.body, |v| {
                let path = v["entry"]["path"].as_str().unwrap_or_default();
                match v["created"].as_bool() {
                    Some(true) => println!("made {path}"),
                    _ => println!("{path} was there"),
                }
                0
            })
        }),
        SessionCommand::Mv {
            id,
            src,
            dest,
            force,
        } => call(
            "POST",
            format!("/v1/sessions/{id}/fs/move"),
            Some(json!({ "source": src, "destination": dest, "overwrite": force })),
        )
        .map(|a| ok_or_report(a.status, &a.body, |_| 0)),
        SessionCommand::Rm { id, path } => call(
            "POST",
            format!("/v1/sessions/{id}/fs/remove"),
            Some(json!({ "path": path })),
        )
        .map(|a| ok_or_report(a.status, &a.body, |_| 0)),
        SessionCommand::Watch {
            id,
            path,
            recursive,
            count,
            seconds,
            json,
        } => watch(
            &call,
            &id,
            json!({ "path": path, "recursive": recursive }),
            count,
            seconds.map(std::time::Duration::from_secs),
            json,
        ),
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
    report(result)
}

fn report(result: Result<i32, String>) -> i32 {
    match result {
        Ok(status) => status,
        Err(e) => {
            eprintln!("codecage: {e}");
            125
        }
    }
}

/// "STDOUT:STDERR" byte offsets.
fn parse_cursor(text: &str) -> Result<(u64, u64), String> {
    text.split_once(':')
        .and_then(|(o, e)| Some((o.trim().parse().ok()?, e.trim().parse().ok()?)))
        .ok_or_else(|| format!("{text:?}: give STDOUT:STDERR, two byte offsets (e.g. 120:0)"))
}

/// How a process (the API's object) stands, in words.
fn status_words(p: &Value) -> String {
    let mut words = match (
        p["status"].as_str(),
        p["exit_code"].as_i64(),
        p["signal"].as_i64(),
    ) {
        (Some("running"), _, _) => "running".to_string(),
        (_, Some(code), _) => format!("exited {code}"),
        (_, None, Some(signal)) => format!("killed by signal {signal}"),
        _ => "exited".to_string(),
    };
    if p["timed_out"] == true {
        words.push_str(" (timeout)");
    }
    words
}

/// A process's answer as an exit status: its own when it ended (124 at its time limit,
/// 128 + the signal that killed it), 0 while it runs (after saying how to follow it; with
/// `print_id`, its id alone on stdout).
fn process_status(session: &str, v: &Value, print_id: bool) -> i32 {
    let pid = v["process_id"].as_u64().unwrap_or(0);
    if v["status"] == "running" {
        if print_id {
            println!("{pid}");
        }
        eprintln!(
            "codecage: process {pid} goes on in the background; follow it with: codecage session logs \
             {session} {pid} --follow{}",
            if print_id {
                String::new()
            } else {
                format!(
                    " --from {}:{}",
                    v["stdout_cursor"].as_u64().unwrap_or(0),
                    v["stderr_cursor"].as_u64().unwrap_or(0)
                )
            }
        );
        return 0;
    }
    if let Some(error) = v["error"].as_str() {
        eprintln!("codecage: process {pid}: {error}");
    }
    if v["timed_out"] == true {
        eprintln!("codecage: process {pid} was killed at its time limit");
        return 124;
    }
    match (v["exit_code"].as_i64(), v["signal"].as_i64()) {
        (Some(code), _) => code as i32,
        (None, Some(signal)) => 128 + signal as i32,
        _ => 0,
    }
}

/// The stdout and stderr of an answer (a call's or a process's), to ours.
fn print_streams(v: &Value) {
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
}

/// A JSON request to the server: method, path, body.
type Call<'a> = dyn Fn(&str, String, Option<Value>) -> Result<client::Answer, String> + 'a;

/// `session watch`: a polled watcher, its events printed as they come (every 200 ms), then
/// removed. Ends at --count, --seconds, SIGINT or the watch's own end (the directory
/// removed, the session closed: exit status 1).
fn watch(
    call: &Call<'_>,
    id: &str,
    request: Value,
    count: Option<usize>,
    limit: Option<std::time::Duration>,
    json: bool,
) -> Result<i32, String> {
    let made = call(
        "POST",
        format!("/v1/sessions/{id}/fs/watchers"),
        Some(request),
    )?;
    let mut watcher = None;
    let status = ok_or_report(made.status, &made.body, |v| {
        watcher = v["watcher_id"].as_str().map(str::to_string);
        eprintln!(
            "codecage: watching {} (C-c to stop)",
            v["path"].as_str().unwrap_or_default()
        );
        0
    });
    let Some(watcher) = watcher else {
        return Ok(status);
    };
    let interrupt = interrupt_fd();
    let url = format!("/v1/sessions/{id}/fs/watchers/{watcher}");
    let started = std::time::Instant::now();
    let (mut cursor, mut seen) = (0u64, 0usize);
    let status = loop {
        let answer = call("GET", format!("{url}?after={cursor}"), None)?;
        if !(200..300).contains(&answer.status) {
            break ok_or_report(answer.status, &answer.body, |_| 0);
        }
        let v: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        for event in v["events"].as_array().into_iter().flatten() {
            if count.is_some_and(|n| seen >= n) {
                break;
            }
            if json {
                println!("{event}");
            } else {
                println!(
                    "{} {}",
                    event["type"].as_str().unwrap_or_default(),
                    event["path"].as_str().unwrap_or_default()
                );
            }
            seen += 1;
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        cursor = v["cursor"].as_u64().unwrap_or(cursor);
        if let Some(why) = v["ended"].as_str() {
            eprintln!("codecage: the watch ended: {why}");
            break 1;
        }
        let done = count.is_some_and(|n| seen >= n)
            || limit.is_some_and(|l| started.elapsed() >= l)
            || interrupt
                .as_ref()
                .is_some_and(|fd| matches!(fd.read_signal(), Ok(Some(_))));
        if done {
            break 0;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let _ = call("DELETE", url, None);
    Ok(status)
}

/// SIGINT blocked and read from a signalfd instead (C-c then ends the watch cleanly: its
/// watcher is removed on the way out).
fn interrupt_fd() -> Option<nix::sys::signalfd::SignalFd> {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.thread_block().ok()?;
    SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).ok()
}

/// An entry of `/fs/stat` or `/fs/list` as `ls -l` would print it.
fn entry_line(e: &Value) -> String {
    let text = |k: &str| e[k].as_str().unwrap_or_default().to_string();
    let mut line = format!(
        "{} {:<8} {:<8} {:>10}  {}  {}",
        text("permissions"),
        text("owner"),
        text("group"),
        e["size"].as_u64().unwrap_or(0),
        text("modified_time"),
        text("path")
    );
    if let Some(target) = e["symlink_target"].as_str() {
        line.push_str(&format!(" -> {target}"));
    }
    line
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
    if status == 202 && value["status"] == "approval_pending" {
        // `[exec] ask`: nothing ran; a person decides (`codecage approvals`).
        let id = value["approval_id"].as_str().unwrap_or("?");
        eprintln!(
            "codecage: waiting for approval {id}: {}; an administrator decides with `codecage approvals allow {id}` \
             (or deny); `codecage approvals show {id}` gives the process once it starts",
            value["reason"].as_str().unwrap_or("")
        );
        return 3;
    }
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
    print_streams(v);
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

/// The detach sequence of `session attach` on a terminal: C-p C-q, as docker's.
const DETACH: [u8; 2] = [0x10, 0x11];

/// `codecage session attach ID PID` (see its help): the output polled every 100 ms from
/// the cursors, the input forwarded by a thread of its own, until the process ends (its
/// status) or the person detaches (0).
fn attach(
    server: &Server,
    token: Option<&str>,
    call: &Call<'_>,
    id: &str,
    pid: u64,
    from: Option<(u64, u64)>,
) -> Result<i32, String> {
    use std::io::IsTerminal as _;
    use std::os::fd::AsFd as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let poll = |cursor: (u64, u64)| {
        call(
            "GET",
            format!(
                "/v1/sessions/{id}/processes/{pid}?stdout_from={}&stderr_from={}",
                cursor.0, cursor.1
            ),
            None,
        )
    };
    let first = poll(from.unwrap_or((u64::MAX, u64::MAX)))?;
    if !(200..300).contains(&first.status) {
        return Ok(ok_or_report(first.status, &first.body, |_| 0));
    }
    let first: Value = serde_json::from_slice(&first.body).unwrap_or(Value::Null);
    let pty = first["pty"].is_object();
    let stdin = std::io::stdin();
    let raw = match pty && stdin.is_terminal() && first["status"] == "running" {
        true => Some(
            codecage::tty::RawMode::enter(stdin.as_fd())
                .map_err(|e| format!("cannot put this terminal in raw mode: {e}"))?,
        ),
        false => None,
    };
    let detached = Arc::new(AtomicBool::new(false));
    if first["status"] == "running" {
        let (server, token, id) = (server.clone(), token.map(str::to_string), id.to_string());
        let detached = detached.clone();
        let raw = raw.is_some();
        std::thread::spawn(move || {
            forward_input(&server, token.as_deref(), &id, pid, raw, pty, &detached);
        });
    }
    let mut size = None;
    if raw.is_some() {
        // Its screen as it is, then what comes.
        if let Ok(answer) = call(
            "GET",
            format!("/v1/sessions/{id}/processes/{pid}/screen"),
            None,
        ) {
            let v: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
            let rows: Vec<&str> = v["rows"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut out = std::io::stdout();
            let _ = write!(out, "\x1b[H\x1b[2J{}", rows.join("\r\n"));
            let _ = write!(
                out,
                "\x1b[{};{}H",
                v["cursor"]["row"].as_u64().unwrap_or(0) + 1,
                v["cursor"]["col"].as_u64().unwrap_or(0) + 1
            );
            let _ = out.flush();
        }
    }
    let mut cursor = (
        first["stdout_cursor"].as_u64().unwrap_or(0),
        first["stderr_cursor"].as_u64().unwrap_or(0),
    );
    if from.is_some() {
        print_streams(&first);
    }
    let mut last = first;
    loop {
        if last["status"] != "running" {
            drop(raw);
            return Ok(process_status(id, &last, false));
        }
        if detached.load(Ordering::Acquire) {
            drop(raw);
            eprintln!("codecage: detached from process {pid}; it goes on (attach again, or logs --follow)");
            return Ok(0);
        }
        if raw.is_some() {
            // The terminal's size followed (checked each turn: no signal handler needed).
            let now = codecage::tty::window_size(std::io::stdout().as_fd());
            if now.is_some() && now != size {
                size = now;
                if let Some((rows, cols)) = now {
                    let _ = call(
                        "POST",
                        format!("/v1/sessions/{id}/processes/{pid}/resize"),
                        Some(json!({"cols": cols, "rows": rows})),
                    );
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let answer = poll(cursor)?;
        if !(200..300).contains(&answer.status) {
            drop(raw);
            return Ok(ok_or_report(answer.status, &answer.body, |_| 0));
        }
        last = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        print_streams(&last);
        cursor = (
            last["stdout_cursor"].as_u64().unwrap_or(cursor.0),
            last["stderr_cursor"].as_u64().unwrap_or(cursor.1),
        );
    }
}

/// `attach`'s input: in raw mode, the bytes as typed (up to C-p C-q, which detaches);
/// else a line at a time, and the end of input closes a pipe's stdin. A refusal (its
/// stdin is closed, it does not read) is said once and input stops.
fn forward_input(
    server: &Server,
    token: Option<&str>,
    id: &str,
    pid: u64,
    raw: bool,
    pty: bool,
    detached: &std::sync::atomic::AtomicBool,
) {
    use std::io::{BufRead as _, Read as _};
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let path = format!("/v1/sessions/{id}/processes/{pid}/stdin");
    let send = |body: Value| -> bool {
        let closing = body["close"] == true;
        match runtime.block_on(client::request(
            server,
            "POST",
            &path,
            client::Body::Json(body),
            token,
        )) {
            Ok(answer) if (200..300).contains(&answer.status) => true,
            Ok(_) if closing => false,
            Ok(answer) => {
                let v: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
                let end = if raw { "\r\n" } else { "\n" };
                eprint!(
                    "codecage: input not forwarded any more: {}{end}",
                    v["message"].as_str().unwrap_or("refused")
                );
                false
            }
            Err(e) => {
                let end = if raw { "\r\n" } else { "\n" };
                eprint!("codecage: input not forwarded any more: {e}{end}");
                false
            }
        }
    };
    let mut stdin = std::io::stdin().lock();
    if raw {
        let mut buf = [0u8; 4096];
        let mut pending_prefix = false;
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let mut bytes = Vec::with_capacity(n + 1);
            if pending_prefix {
                pending_prefix = false;
                if buf[0] == DETACH[1] {
                    detached.store(true, std::sync::atomic::Ordering::Release);
                    return;
                }
                bytes.push(DETACH[0]);
            }
            bytes.extend_from_slice(&buf[..n]);
            if let Some(at) = bytes.windows(2).position(|w| w == DETACH) {
                bytes.truncate(at);
                if !bytes.is_empty() {
                    send(json!({"data": String::from_utf8_lossy(&bytes)}));
                }
                detached.store(true, std::sync::atomic::Ordering::Release);
                return;
            }
            // A C-p at the end may be the start of the detach sequence: held for the next read.
            if bytes.last() == Some(&DETACH[0]) {
                bytes.pop();
                pending_prefix = true;
            }
            if !bytes.is_empty() && !send(json!({"data": String::from_utf8_lossy(&bytes)})) {
                return;
            }
        }
    }
    let mut line = String::new();
    loop {
        line.clear();
        match stdin.read_line(&mut line) {
            Ok(0) | Err(_) => {
                if !pty {
                    send(json!({"close": true}));
                }
                return;
            }
            Ok(_) => {
                if !send(json!({"data": line})) {
                    return;
                }
            }
        }
    }
}
