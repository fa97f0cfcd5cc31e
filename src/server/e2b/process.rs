//! envd's process service (`process.Process`) over Connect with the JSON codec, as E2B's
//! SDKs call it (`commands.*`, `pty.*`): unary calls are a JSON body and answer; the
//! server-streaming Start and Connect take one enveloped message and answer enveloped
//! events (start, data, end, keepalive) and an end-of-stream envelope. Every call is one
//! of the session's background processes (service::processes); a process's pid is its
//! process id there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::{Extension, Router};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use codecage::processes::{Status, TermSize};

use super::connect::{
    answer, check_user, envelope, message, streamed, streaming, ConnectError, Unary,
};
use super::{E2b, Record, HOME};
use crate::server::api::RawBody;
use crate::server::Shared;
use crate::service::processes::{self as procs, ProcessRequest, PtyOption, StdinRequest};

pub(super) fn routes(router: Router<Shared>) -> Router<Shared> {
    router
        .route("/process.Process/Start", post(start))
        .route("/process.Process/Connect", post(connect))
        .route("/process.Process/List", post(list))
        .route("/process.Process/SendInput", post(send_input))
        .route("/process.Process/SendSignal", post(send_signal))
        .route("/process.Process/CloseStdin", post(close_stdin))
        .route("/process.Process/Update", post(update))
}

/// How often a stream looks for new output.
const POLL: Duration = Duration::from_millis(20);
/// A stream with nothing to say sends a keepalive this often.
const KEEPALIVE: Duration = Duration::from_secs(30);

#[derive(Deserialize, Default)]
#[serde(default)]
struct Selector {
    pid: Option<u64>,
    tag: Option<String>,
}

fn pid_of(selector: Option<Selector>) -> Result<u64, ConnectError> {
    let selector = selector.unwrap_or_default();
    match (selector.pid, selector.tag) {
        (Some(pid), _) => Ok(pid),
        (None, Some(_)) => Err(ConnectError::invalid(
            "a process by tag: codecage's processes are selected by pid only",
        )),
        (None, None) => Err(ConnectError::invalid("the process selector names no pid")),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Size {
    cols: u16,
    rows: u16,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Pty {
    size: Option<Size>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Config {
    cmd: String,
    args: Vec<String>,
    envs: std::collections::BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StartBody {
    process: Option<Config>,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

/// A cwd as E2B names it: `/home/user` is /work.
fn cwd_of(cwd: Option<String>) -> Option<String> {
    cwd.map(|c| match c.strip_prefix(HOME) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("/work{rest}"),
        _ => c,
    })
}

async fn start(
    e2b: Extension<Arc<E2b>>,
    record: Extension<Arc<Record>>,
    headers: HeaderMap,
    body: RawBody,
) -> Response {
    streamed(start_stream(e2b, record, headers, body).await)
}

async fn start_stream(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Unary {
    check_user(&headers)?;
    let body: StartBody = message(&body, true)?;
    let config = body
        .process
        .ok_or_else(|| ConnectError::invalid("the start names no process"))?;
    // A tag is accepted and not kept: the SDK selects its processes by pid.
    let _ = body.tag;
    let mut argv = vec![config.cmd];
    argv.extend(config.args);
    let pty = body.pty.map(|p| {
        let size = p.size.unwrap_or_default();
        TermSize {
            cols: if size.cols == 0 { 80 } else { size.cols },
            rows: if size.rows == 0 { 24 } else { size.rows },
        }
    });
    let request = ProcessRequest {
        argv: Some(argv),
        cwd: cwd_of(config.cwd),
        env: config.envs,
        // A terminal's input is always open (its terminal, not a stdin pipe).
        stdin: body.stdin.unwrap_or(false) && pty.is_none(),
        pty: PtyOption(pty),
        background: true,
        ..ProcessRequest::default()
    };
    let snapshot = procs::start(
        &e2b.state,
        &record.caller,
        crate::audit::Via::E2b,
        &record.id,
        request,
    )
    .await?;
    Ok(stream(e2b, record, snapshot.id, 0, 0))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ConnectBody {
    process: Option<Selector>,
}

async fn connect(
    e2b: Extension<Arc<E2b>>,
    record: Extension<Arc<Record>>,
    body: RawBody,
) -> Response {
    streamed(connect_stream(e2b, record, body).await)
}

async fn connect_stream(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    RawBody(body): RawBody,
) -> Unary {
    let body: ConnectBody = message(&body, true)?;
    let pid = pid_of(body.process)?;
    // From now on: what it wrote before is not sent again.
    let now = procs::poll(&e2b.state, &record.caller, &record.id, pid, 0, 0)?;
    Ok(stream(
        e2b,
        record,
        pid,
        now.stdout.cursor,
        now.stderr.cursor,
    ))
}

/// A process's events as a Connect stream: start, its output as it comes, its end.
fn stream(e2b: Arc<E2b>, record: Arc<Record>, pid: u64, out: u64, err: u64) -> Response {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let event = |event: Value| envelope(0, &json!({"event": event}));
        if sender
            .send(event(json!({"start": {"pid": pid}})))
            .await
            .is_err()
        {
            return;
        }
        let (mut out, mut err) = (out, err);
        let mut quiet_since = Instant::now();
        let end = loop {
            let snapshot = match procs::poll(&e2b.state, &record.caller, &record.id, pid, out, err)
            {
                Ok(snapshot) => snapshot,
                Err(e) => break json!({"error": ConnectError::from(e).json()}),
            };
            let stdout_name = if snapshot.pty.is_some() {
                "pty"
            } else {
                "stdout"
            };
            for (name, window) in [
                (stdout_name, &snapshot.stdout),
                ("stderr", &snapshot.stderr),
            ] {
                if window.bytes.is_empty() {
                    continue;
                }
                let data = base64::engine::general_purpose::STANDARD.encode(&window.bytes);
                if sender
                    .send(event(json!({"data": {name: data}})))
                    .await
                    .is_err()
                {
                    return;
                }
                quiet_since = Instant::now();
            }
            out = snapshot.stdout.cursor;
            err = snapshot.stderr.cursor;
            if snapshot.status == Status::Exited {
                let status = match (snapshot.exit_code, snapshot.signal) {
                    (Some(code), _) => format!("exit status {code}"),
                    (None, Some(signal)) => format!("signal: {}", procs::signal_name(signal)),
                    _ => "exited".to_string(),
                };
                let mut end = json!({
                    "exitCode": snapshot.exit_code.unwrap_or(-1),
                    "exited": snapshot.exit_code.is_some(),
                    "status": status,
                });
                if let Some(error) = snapshot.error.or_else(|| {
                    snapshot.timed_out.then(|| {
                        "codecage: timeout: the process passed its time limit and was killed"
                            .to_string()
                    })
                }) {
                    end["error"] = json!(error);
                }
                if sender.send(event(json!({"end": end}))).await.is_err() {
                    return;
                }
                break json!({});
            }
            if sender.is_closed() {
                // The client went away: the process goes on, as E2B's do.
                return;
            }
            if quiet_since.elapsed() >= KEEPALIVE {
                if sender.send(event(json!({"keepalive": {}}))).await.is_err() {
                    return;
                }
                quiet_since = Instant::now();
            }
            tokio::time::sleep(POLL).await;
        };
        let _ = sender.send(envelope(2, &end)).await;
    });
    streaming(receiver)
}

async fn list(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
) -> Unary {
    let processes: Vec<Value> = procs::list(&e2b.state, &record.caller, &record.id)?
        .into_iter()
        .filter(|p| p.status == Status::Running)
        .map(|p| {
            json!({
                "config": {"cmd": p.command, "args": [], "envs": {}},
                "pid": p.id,
            })
        })
        .collect();
    answer(json!({"processes": processes}))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SendInputBody {
    process: Option<Selector>,
    input: Option<Input>,
}

async fn send_input(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    RawBody(body): RawBody,
) -> Unary {
    let body: SendInputBody = message(&body, false)?;
    let pid = pid_of(body.process)?;
    let input = body.input.unwrap_or_default();
    let encoded = input.stdin.or(input.pty).unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| ConnectError::invalid(format!("input: not base64 ({e})")))?;
    let data = String::from_utf8(bytes).map_err(|_| {
        ConnectError::invalid("input: codecage writes text to a process's stdin (UTF-8)")
    })?;
    let request = StdinRequest {
        data,
        ..StdinRequest::default()
    };
    procs::write_stdin(&e2b.state, &record.caller, &record.id, pid, request).await?;
    answer(json!({}))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct SignalBody {
    process: Option<Selector>,
    signal: Value,
}

async fn send_signal(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    RawBody(body): RawBody,
) -> Unary {
    let body: SignalBody = message(&body, false)?;
    let pid = pid_of(body.process)?;
    let signal = match &body.signal {
        Value::String(s) if s == "SIGNAL_SIGKILL" => json!("KILL"),
        Value::String(s) if s == "SIGNAL_SIGTERM" => json!("TERM"),
        Value::Number(n) if n.as_i64() == Some(9) => json!("KILL"),
        Value::Number(n) if n.as_i64() == Some(15) => json!("TERM"),
        other => {
            return Err(ConnectError::invalid(format!(
                "signal {other}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"
            )))
        }
    };
    procs::signal_process(&e2b.state, &record.caller, &record.id, pid, &signal)?;
    answer(json!({}))
}

async fn close_stdin(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    RawBody(body): RawBody,
) -> Unary {
    let body: ConnectBody = message(&body, false)?;
    let pid = pid_of(body.process)?;
    let request = StdinRequest {
        close: true,
        ..StdinRequest::default()
    };
    procs::write_stdin(&e2b.state, &record.caller, &record.id, pid, request).await?;
    answer(json!({}))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct UpdateBody {
    process: Option<Selector>,
    pty: Option<Pty>,
}

async fn update(
    Extension(e2b): Extension<Arc<E2b>>,
    Extension(record): Extension<Arc<Record>>,
    RawBody(body): RawBody,
) -> Unary {
    let body: UpdateBody = message(&body, false)?;
    let pid = pid_of(body.process)?;
    let Some(size) = body.pty.and_then(|p| p.size) else {
        return answer(json!({}));
    };
    let request = procs::ResizeRequest {
        cols: size.cols,
        rows: size.rows,
    };
    procs::resize_process(&e2b.state, &record.caller, &record.id, pid, request)?;
    answer(json!({}))
}
