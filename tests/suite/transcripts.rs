//! The transcript corpus (tests/transcripts/, its README says the format): each agent-style
//! sequence of calls run through the library, the HTTP API and MCP alike, each step's
//! result held to the transcript's expectations on every surface. They run on the default
//! image (pandas, TypeScript), as the server's profiles do.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use codecage::runner::Lang;
use codecage::session::Call;
use codecage::Rootfs;
use serde_json::{json, Value};

use super::common::*;
use super::image::image_test;
use super::mcp::{drive, mcp_python, mcp_stdio};
use super::server::Server;
use super::sessions::{json, session_on};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/transcripts");

struct Transcript {
    name: String,
    language: String,
    steps: Vec<Value>,
}

fn transcripts() -> Vec<Transcript> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(DIR)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no transcripts in {DIR}");
    files
        .iter()
        .map(|path| {
            let data: Value = serde_json::from_slice(&std::fs::read(path).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Transcript {
                name: path.file_stem().unwrap().to_string_lossy().into(),
                language: data["language"].as_str().expect("language").into(),
                steps: data["steps"].as_array().expect("steps").clone(),
            }
        })
        .collect()
}

fn lang(name: &str) -> Lang {
    match name {
        "python" => Lang::Python,
        "node" => Lang::Node,
        "typescript" => Lang::Typescript,
        "bash" => Lang::Bash,
        other => panic!("a transcript's language is {other}"),
    }
}

fn applies(step: &Value, surface: &str) -> bool {
    !step["skip"]
        .as_array()
        .is_some_and(|s| s.iter().any(|x| x == surface))
}

fn timeout(step: &Value) -> Option<u64> {
    step["timeout"].as_u64().map(|t| t * slowdown())
}

/// Holds a call's result (the library's and the API's JSON) to a step's expectations.
fn check_outcome(where_: &str, expect: &Value, out: &Value) {
    let Some(expect) = expect.as_object() else {
        return;
    };
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    for (key, want) in expect {
        let ok = match key.as_str() {
            "stdout" => out["stdout"] == *want,
            "stdout_contains" | "stderr_contains" => {
                let stream = text(&out[key.trim_end_matches("_contains")]);
                want.as_array()
                    .unwrap()
                    .iter()
                    .all(|s| stream.contains(s.as_str().unwrap()))
            }
            "error" => out["error"] == *want,
            "result" => out["result"]["text/plain"] == *want,
            "result_contains" => text(&out["result"]["text/plain"]).contains(&text(want)),
            "exception" => out["exception"]["name"] == *want,
            "exit_code" => out["exit_code"] == *want,
            "restarted" => out["state"]["restarted"] == *want,
            "preserved" => out["state"]["preserved"] == *want,
            "killed" => {
                out["killed"].as_array().map_or(0, Vec::len) as u64 == want.as_u64().unwrap()
            }
            other => panic!("{where_}: unknown expectation {other}"),
        };
        assert!(ok, "{where_}: expected {key} = {want}, got {out}");
    }
}

/// The same expectations, on the text an MCP tool answers with.
fn check_mcp(where_: &str, expect: &Value, shell: bool, result: &Value) {
    let Some(expect) = expect.as_object() else {
        return;
    };
    let text: String = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap_or_default())
        .collect();
    for (key, want) in expect {
        let ok = match key.as_str() {
            "stdout" => text.starts_with(want.as_str().unwrap()),
            "stdout_contains" | "stderr_contains" => want
                .as_array()
                .unwrap()
                .iter()
                .all(|s| text.contains(s.as_str().unwrap())),
            "error" => match want.as_str() {
                None => !text.contains("[error: "),
                Some("exception") => text.contains("[exception] "),
                Some(kind) => text.contains(&format!("[error: {kind}]")),
            },
            "result" => text.contains(&format!("[result]\n{}\n", want.as_str().unwrap())),
            "result_contains" => {
                text.contains("[result]\n") && text.contains(want.as_str().unwrap())
            }
            "exception" => text.contains(&format!("[exception] {}", want.as_str().unwrap())),
            "exit_code" if shell => match want.as_i64().unwrap() {
                0 => !text.contains("[exit status"),
                code => text.contains(&format!("[exit status {code}]")),
            },
            "restarted" if want == true => text.contains("[state: the interpreter was restarted"),
            // Not in the MCP text: the exit status of an interpreter, the state kept, the
            // processes killed (said in the error's message).
            "exit_code" | "restarted" | "preserved" | "killed" => true,
            other => panic!("{where_}: unknown expectation {other}"),
        };
        assert!(ok, "{where_}: expected {key} = {want}, got:\n{text}");
    }
}

#[test]
fn through_the_library() {
    image_test(|image| {
        for t in transcripts() {
            let mut s = session_on(lang(&t.language), Rootfs::Dir(image.to_path_buf()), None);
            for (i, step) in t.steps.iter().enumerate() {
                let where_ = format!("{} step {i} (library)", t.name);
                if step["reset"] == true {
                    s.reset(None).unwrap_or_else(|e| panic!("{where_}: {e}"));
                    continue;
                }
                if !applies(step, "library") {
                    continue;
                }
                let out = s.execute(
                    &Call {
                        code: step["code"].as_str().unwrap().into(),
                        stdin: step["stdin"].as_str().map(str::to_string),
                        timeout: timeout(step).map(Duration::from_secs),
                        ..Call::default()
                    },
                    &mut |_| {},
                );
                check_outcome(&where_, &step["expect"], &json(&out));
            }
            s.close().unwrap();
        }
    });
}

/// A JSON request over the server's socket with the body from a file (a cell may be
/// larger than an argument may be).
fn post(server: &Server, dir: &Path, path: &str, body: &Value) -> (u16, Value) {
    let file = dir.join("body.json");
    std::fs::write(&file, body.to_string()).unwrap();
    let out = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(server.socket_path())
        .args(["-X", "POST", "-H", "Content-Type: application/json"])
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg(format!("http://codecage{path}"))
        .stdin(Stdio::null())
        .output()
        .expect("curl");
    let (status, body) = super::server::split_status(&out.stdout);
    (
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    )
}

#[test]
fn through_the_http_api() {
    image_test(|_| {
        let server = Server::start("", false);
        let dir = TempDir::new("transcripts");
        for t in transcripts() {
            let (status, created) = post(
                &server,
                dir.path(),
                "/v1/sessions",
                &json!({"language": t.language}),
            );
            assert_eq!(status, 201, "{}: {created}", t.name);
            let id = created["id"].as_str().unwrap().to_string();
            for (i, step) in t.steps.iter().enumerate() {
                let where_ = format!("{} step {i} (HTTP)", t.name);
                if step["reset"] == true {
                    let (status, body) = post(
                        &server,
                        dir.path(),
                        &format!("/v1/sessions/{id}/reset"),
                        &json!({}),
                    );
                    assert!(status < 300, "{where_}: {status} {body}");
                    continue;
                }
                if !applies(step, "http") {
                    continue;
                }
                let mut body = json!({"code": step["code"]});
                if let Some(stdin) = step.get("stdin") {
                    body["stdin"] = stdin.clone();
                }
                if let Some(t) = timeout(step) {
                    body["timeout"] = json!(t);
                }
                let (status, out) = post(
                    &server,
                    dir.path(),
                    &format!("/v1/sessions/{id}/execute"),
                    &body,
                );
                assert_eq!(status, 200, "{where_}: {out}");
                check_outcome(&where_, &step["expect"], &out);
            }
            let (status, _) = server.request("DELETE", &format!("/v1/sessions/{id}"), None);
            assert!(status < 300, "{}: DELETE answered {status}", t.name);
        }
        server.stop();
    });
}

#[test]
fn through_mcp() {
    image_test(|_| {
        let python = match mcp_python() {
            Ok(python) => python,
            Err(why) => return unavailable(&why),
        };
        for t in transcripts() {
            let (tool, field) = match t.language.as_str() {
                "python" => ("execute_python", "code"),
                "bash" => ("execute_shell", "command"),
                // execute_node runs under the typescript profile: plain JavaScript too.
                _ => ("execute_node", "code"),
            };
            let mut steps = Vec::new();
            let mut checks = Vec::new();
            for (i, step) in t.steps.iter().enumerate() {
                if step["reset"] == true {
                    if t.language == "python" {
                        steps.push(json!({"tool": "reset_repl", "args": {}}));
                        checks.push(None);
                    }
                    continue;
                }
                if !applies(step, "mcp") || step.get("stdin").is_some() {
                    continue;
                }
                let mut args = json!({field: step["code"]});
                if let Some(t) = timeout(step) {
                    args["timeout"] = json!(t);
                }
                steps.push(json!({"tool": tool, "args": args}));
                checks.push(Some((i, step["expect"].clone())));
            }
            let results = drive(&python, mcp_stdio(&[]), Value::Array(steps));
            assert_eq!(results.len(), checks.len(), "{}: {results:?}", t.name);
            for (result, check) in results.iter().zip(checks) {
                if let Some((i, expect)) = check {
                    let where_ = format!("{} step {i} (MCP)", t.name);
                    assert!(result.get("exception").is_none(), "{where_}: {result}");
                    check_mcp(&where_, &expect, t.language == "bash", result);
                }
            }
        }
    });
}
