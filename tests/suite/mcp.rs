//! The MCP server driven by the official MCP Python SDK client (the `mcp` package, in the
//! venv `cargo xtask test` makes): `codecage mcp` over stdio, and `/mcp` on `codecage
//! serve` over streamable HTTP. Each plan runs in one client connection; the host is
//! checked after each test (the stdio server closes its sessions when the client goes).

use std::path::PathBuf;
use std::process::Command;

use base64::Engine as _;
use serde_json::{json, Value};

use super::common::*;
use super::image::image_test;
use super::server::Server;

/// The venv's python with the `mcp` package, or why there is none.
pub(super) fn mcp_python() -> Result<PathBuf, String> {
    let path = std::env::var_os("CODECAGE_MCP_PYTHON").map_or_else(
        || PathBuf::from("/var/cache/codecage/mcp-client/bin/python"),
        PathBuf::from,
    );
    let ok = Command::new(&path)
        .args(["-c", "import mcp"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Ok(path)
    } else {
        Err(format!(
            "the MCP Python SDK client ({} with the `mcp` package; `cargo xtask test` installs it)",
            path.display()
        ))
    }
}

/// An MCP test: root, the built image (the tools run pandas, matplotlib, TypeScript) and
/// the SDK client.
fn mcp_test(test: impl FnOnce(&PathBuf)) {
    image_test(|_| match mcp_python() {
        Ok(python) => test(&python),
        Err(why) => unavailable(&why),
    });
}

/// Runs `steps` in one connection; one JSON value per step.
pub(super) fn drive(python: &PathBuf, mut transport: Value, steps: Value) -> Vec<Value> {
    let dir = TempDir::new("mcp");
    let plan = dir.path().join("plan.json");
    let pidfile = dir.path().join("server.pid");
    if transport.get("stdio").is_some() {
        // Its audit log in the test's dir, not the host's.
        let config = dir.path().join("mcp.toml");
        let db = dir.path().join("audit").join("audit.db");
        std::fs::write(&config, format!("[audit]\npath = {db:?}\n")).unwrap();
        transport["env"] = json!({"PIDFILE": pidfile, "MCP_CONFIG": config});
    }
    std::fs::write(
        &plan,
        json!({"transport": transport, "steps": steps}).to_string(),
    )
    .unwrap();
    let driver = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/suite/scripts/mcp_driver.py"
    );
    let out = Command::new(python).arg(driver).arg(&plan).launch_output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the MCP client failed: {stderr}\n{stdout}"
    );
    if let Ok(pid) = std::fs::read_to_string(&pidfile) {
        super::host::note_launcher(pid.trim().parse().unwrap());
    }
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `codecage mcp ARGS` as the client starts it; the server's pid goes to a file the
/// harness reads (its cgroups are named after it).
pub(super) fn mcp_stdio(args: &[&str]) -> Value {
    let command = format!(
        "echo $$ > \"$PIDFILE\"; exec {} mcp --config \"$MCP_CONFIG\" {}",
        env!("CARGO_BIN_EXE_codecage"),
        args.join(" ")
    );
    json!({"stdio": ["bash", "-c", command]})
}

fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap_or_default())
        .collect()
}

fn is_error(result: &Value) -> bool {
    result["isError"] == true
}

fn blocks<'a>(result: &'a Value, kind: &str) -> Vec<&'a Value> {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["type"] == kind)
        .collect()
}

/// The width and height in a PNG's header.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let be = |i: usize| u32::from_be_bytes([png[i], png[i + 1], png[i + 2], png[i + 3]]);
    (be(16), be(20))
}

fn tool(name: &str, args: Value) -> Value {
    json!({"tool": name, "args": args})
}

#[test]
fn over_stdio_the_tools_keep_state_and_return_what_a_model_can_use() {
    mcp_test(|python| {
        let steps = json!([
            {"list_tools": true},
            tool("execute_python", json!({"code": "x = 1"})),
            tool("execute_python", json!({"code": "x + 1"})),
            tool("reset_repl", json!({})),
            tool("execute_python", json!({"code": "x"})),
            tool("execute_python", json!({"code": "import matplotlib.pyplot as plt\nplt.figure(figsize=(8, 4))\nplt.plot([1, 3, 2])\nplt.show()"})),
            tool("execute_shell", json!({"command": "cd /tmp && printf 'b\\na\\nb\\n' | sort | uniq -c | sort -rn | head -1"})),
            tool("execute_shell", json!({"command": "pwd; false"})),
            tool("execute_node", json!({"code": "const greeting: string = 'hi'; let n = 41"})),
            tool("execute_node", json!({"code": "`${greeting} ${n + 1}`"})),
            tool("execute_python", json!({"code": "print('x' * 40000)"})),
            tool("execute_python", json!({"code": "1/0"})),
        ]);
        let results = drive(python, mcp_stdio(&["--image-max-edge", "300"]), steps);
        // The tools, with their schemas and descriptions that give the limits.
        let tools = results[0]["tools"].as_array().unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        for name in [
            "execute_python",
            "execute_node",
            "execute_shell",
            "reset_repl",
            "list_files",
            "read_file",
            "write_file",
            "create_session",
            "close_session",
        ] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
        for t in tools {
            assert!(t.get("outputSchema").is_none(), "{t}");
            assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        }
        let python_tool = tools
            .iter()
            .find(|t| t["name"] == "execute_python")
            .unwrap();
        assert_eq!(python_tool["inputSchema"]["required"], json!(["code"]));
        let description = python_tool["description"].as_str().unwrap();
        assert!(
            description.contains("30s") && description.contains("persist"),
            "{description}"
        );
        let shell_tool = tools.iter().find(|t| t["name"] == "execute_shell").unwrap();
        assert_eq!(shell_tool["inputSchema"]["required"], json!(["command"]));
        // State, reset.
        assert!(!is_error(&results[1]), "{}", results[1]);
        assert_eq!(text(&results[2]), "[result]\n2\n", "{}", results[2]);
        assert!(!is_error(&results[3]), "{}", results[3]);
        assert!(
            is_error(&results[4]) && text(&results[4]).contains("NameError"),
            "{}",
            results[4]
        );
        // The figure: an image block, a PNG rendered in the sandbox within the edge (the
        // server decodes none; `bbox_inches="tight"` may make it a little smaller).
        let images = blocks(&results[5], "image");
        assert_eq!(images.len(), 1, "{}", results[5]);
        assert_eq!(images[0]["mimeType"], "image/png");
        let png = base64::engine::general_purpose::STANDARD
            .decode(images[0]["data"].as_str().unwrap())
            .unwrap();
        let (w, h) = png_size(&png);
        assert!(w.max(h) <= 300 && w.max(h) >= 200, "{w}x{h}");
        assert!(results[5].get("structuredContent").is_none());
        // The shell: a pipeline, cd kept, a failing status is an error.
        assert_eq!(text(&results[6]).trim(), "2 b", "{}", results[6]);
        assert!(text(&results[7]).starts_with("/tmp\n"), "{}", results[7]);
        assert!(is_error(&results[7]) && text(&results[7]).contains("[exit status 1]"));
        // Node with TypeScript keeps its variables.
        assert!(!is_error(&results[8]), "{}", results[8]);
        assert!(text(&results[9]).contains("hi 42"), "{}", results[9]);
        // Long output: head and tail in the text, all of it behind a resource link.
        let long = text(&results[10]);
        assert!(
            long.len() < 25_000 && long.contains("bytes cut"),
            "{}",
            long.len()
        );
        let links = blocks(&results[10], "resource_link");
        assert_eq!(links.len(), 2, "{}", results[10]);
        // An exception: the name, value and traceback, isError.
        let e = text(&results[11]);
        assert!(is_error(&results[11]));
        assert!(
            e.contains("ZeroDivisionError: division by zero") && e.contains("Traceback"),
            "{e}"
        );
    });
}

#[test]
fn timeouts_oom_cancellation_and_progress() {
    mcp_test(|python| {
        let steps = json!([
            tool("execute_python", json!({"code": "kept = 'yes'"})),
            tool("execute_python", json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(60)", "timeout": 1})),
            tool("execute_python", json!({"code": "kept"})),
            tool("execute_python", json!({"code": "x = bytearray(2 << 30)"})),
            tool("execute_python", json!({"code": "kept = 'again'\nprint('after', 6 * 7)"})),
            {"tool": "execute_python", "args": {"code": "import time\nfor i in range(30):\n    print('tick', i, flush=True)\n    time.sleep(0.1)"}, "progress": true},
            {"tool": "execute_python", "args": {"code": "import time\nwhile True: time.sleep(0.1)"}, "cancel_after": 1.5},
            tool("execute_python", json!({"code": "kept"})),
            tool("execute_python", json!({"code": "1", "timeout": 100000})),
        ]);
        let results = drive(python, mcp_stdio(&[]), steps);
        // A timeout: the output so far, isError, and the state kept.
        let t = text(&results[1]);
        assert!(is_error(&results[1]), "{}", results[1]);
        assert!(
            t.contains("started") && t.contains("[error: timeout]"),
            "{t}"
        );
        assert!(t.contains("[state: preserved"), "{t}");
        assert!(text(&results[2]).contains("'yes'"), "{}", results[2]);
        // A memory bomb: oom, and the next call works.
        assert!(is_error(&results[3]), "{}", results[3]);
        assert!(text(&results[3]).contains("[error: oom]"), "{}", results[3]);
        assert!(text(&results[3]).contains("restarted"), "{}", results[3]);
        assert_eq!(text(&results[4]), "after 42\n", "{}", results[4]);
        // Progress while a call runs, with the output so far.
        let progress = results[5]["progress"].as_array().unwrap();
        assert!(progress.len() >= 2, "{}", results[5]);
        assert!(
            progress
                .iter()
                .any(|p| p["message"].as_str().unwrap_or("").contains("tick")),
            "{progress:?}"
        );
        // Cancelled by the client: interrupted like a timeout, the state kept.
        assert_eq!(results[6]["cancelled"], true, "{}", results[6]);
        assert!(text(&results[7]).contains("'again'"), "{}", results[7]);
        // Above the profile's maximum: a policy error, as a tool result.
        assert!(
            is_error(&results[8]) && text(&results[8]).contains("[policy]"),
            "{}",
            results[8]
        );
    });
}

#[test]
fn files_go_in_and_come_back_as_images_text_and_links() {
    mcp_test(|python| {
        let csv = "city,temp\nOslo,4\nLima,19\n";
        let steps = json!([
            tool(
                "write_file",
                json!({"path": "data/temps.csv", "content": csv})
            ),
            tool(
                "write_file",
                json!({"path": "/work/raw.bin", "content": "AAEC", "encoding": "base64"})
            ),
            tool(
                "execute_python",
                json!({"code": "import os, pandas as pd\nos.makedirs('out', exist_ok=True)\ndf = pd.read_csv('data/temps.csv')\ndf['f'] = df.temp * 9 / 5 + 32\ndf.to_csv('out/temps_f.csv', index=False)\nimport matplotlib.pyplot as plt\nplt.bar(df.city, df.temp); plt.savefig('out/bars.png')\nlen(df)"})
            ),
            tool("list_files", json!({"path": "out"})),
            tool("read_file", json!({"path": "out/temps_f.csv"})),
            tool("read_file", json!({"path": "out/bars.png"})),
            tool("read_file", json!({"path": "raw.bin"})),
            tool("read_file", json!({"path": "../etc/passwd"})),
            tool(
                "execute_python",
                json!({"code": "1", "session_id": "0123456789abcdef"})
            ),
        ]);
        let results = drive(python, mcp_stdio(&[]), steps);
        assert!(
            !is_error(&results[0]) && !is_error(&results[1]),
            "{results:?}"
        );
        let call = &results[2];
        assert!(text(call).contains("[result]\n2\n"), "{call}");
        let links: Vec<&str> = blocks(call, "resource_link")
            .iter()
            .map(|l| l["uri"].as_str().unwrap())
            .collect();
        assert_eq!(links.len(), 2, "{call}");
        assert!(
            links.iter().any(|u| u.ends_with("/files/out/temps_f.csv")),
            "{links:?}"
        );
        let listing = text(&results[3]);
        assert!(
            listing.contains("bars.png") && listing.contains("temps_f.csv"),
            "{listing}"
        );
        assert_eq!(
            text(&results[4]),
            "city,temp,f\nOslo,4,39.2\nLima,19,66.2\n",
            "{}",
            results[4]
        );
        let image = blocks(&results[5], "image");
        assert_eq!(image.len(), 1, "{}", results[5]);
        let resource = blocks(&results[6], "resource");
        assert_eq!(resource.len(), 1, "{}", results[6]);
        assert_eq!(resource[0]["resource"]["blob"], "AAEC");
        assert!(
            is_error(&results[7]) && text(&results[7]).contains(".."),
            "{}",
            results[7]
        );
        // An unknown session id is a tool error that says so.
        assert!(is_error(&results[8]), "{}", results[8]);
        assert!(
            text(&results[8]).contains("create_session"),
            "{}",
            results[8]
        );
    });
}

/// A call's output cut from its text is kept behind `codecage://outputs/KEY/...` for the
/// caller that made it (and an admin): another token reading the same URI is told no such
/// output is kept, as for a key that never was.
#[test]
fn over_http_a_cut_output_is_its_callers_alone() {
    mcp_test(|python| {
        const OTHER: &str = "other-token-0123456789abcdef";
        let server = Server::start(
            &format!("[[tokens]]\nname = \"other\"\ntoken = \"{OTHER}\"\n"),
            true,
        );
        let url = format!("http://{}/mcp", server.tcp_address());
        let mine = json!({"http": url, "token": super::server::TOKEN});
        let results = drive(
            python,
            mine.clone(),
            json!([tool(
                "execute_python",
                json!({"code": "print('x' * 30000)"})
            )]),
        );
        let shown = text(&results[0]);
        let uri = shown
            .split_whitespace()
            .find(|w| w.starts_with("codecage://outputs/"))
            .unwrap_or_else(|| panic!("no output link in {shown}"))
            .to_string();
        assert!(uri.ends_with("/stdout"), "{uri}");
        let results = drive(python, mine, json!([{"read_resource": uri}]));
        assert!(
            results[0].to_string().contains(&"x".repeat(30000)),
            "{}",
            results[0]
        );
        let results = drive(
            python,
            json!({"http": url, "token": OTHER}),
            json!([{"read_resource": uri}]),
        );
        let refused = results[0]["exception"].as_str().unwrap_or_default();
        assert!(refused.contains("no such output"), "{}", results[0]);
        server.stop();
    });
}

#[test]
fn over_http_sessions_are_explicit_and_the_token_is_needed() {
    mcp_test(|python| {
        let server = Server::start("", true);
        let server_db = server.audit_db();
        let address = server.tcp_address();
        let url = format!("http://{address}/mcp");
        // Without the token: refused before anything runs.
        let out = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-X",
                "POST",
                "-H",
            ])
            .arg("Content-Type: application/json")
            .args(["-d", r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#])
            .arg(&url)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "401");
        let results = drive(
            python,
            json!({"http": url, "token": null}),
            json!([tool("execute_python", json!({"code": "1"}))]),
        );
        assert!(
            results.is_empty() || results[0].get("exception").is_some(),
            "{results:?}"
        );
        let token = super::server::TOKEN;
        let results = drive(
            python,
            json!({"http": url, "token": token}),
            json!([
                tool("execute_python", json!({"code": "y = 5\nprint(y)"})),
                tool("execute_python", json!({"code": "y"})),
                tool("create_session", json!({"language": "python"})),
            ]),
        );
        // Without a session: a fresh sandbox each call.
        assert_eq!(text(&results[0]), "5\n", "{}", results[0]);
        assert!(
            is_error(&results[1]) && text(&results[1]).contains("NameError"),
            "{}",
            results[1]
        );
        let created = text(&results[2]);
        let id = created
            .lines()
            .find_map(|l| l.strip_prefix("session_id: "))
            .unwrap_or_else(|| panic!("{created}"))
            .to_string();
        // The session lives across connections (requests), by id.
        let results = drive(
            python,
            json!({"http": url, "token": token}),
            json!([
                tool("execute_python", json!({"code": "z = 6", "session_id": id})),
                tool("execute_python", json!({"code": "z * 7", "session_id": id})),
                tool(
                    "write_file",
                    json!({"path": "n.txt", "content": "7", "session_id": id})
                ),
                tool("read_file", json!({"path": "n.txt", "session_id": id})),
                tool("list_files", json!({})),
                tool("close_session", json!({"session_id": id})),
                tool("execute_python", json!({"code": "z", "session_id": id})),
            ]),
        );
        assert_eq!(text(&results[1]), "[result]\n42\n", "{}", results[1]);
        assert_eq!(text(&results[3]), "7", "{}", results[3]);
        assert!(
            is_error(&results[4]) && text(&results[4]).contains("session_id"),
            "{}",
            results[4]
        );
        assert!(!is_error(&results[5]), "{}", results[5]);
        assert!(is_error(&results[6]), "{}", results[6]);
        let gone = text(&results[6]);
        assert!(
            gone.contains(&id) && gone.contains("create_session"),
            "{gone}"
        );
        // The audit log has each of them, through MCP, by the token's name.
        let mut records: Vec<Value> = Vec::new();
        let closed = wait_for(std::time::Duration::from_secs(10), || {
            let out = codecage()
                .args(["audit", "--db"])
                .arg(&server_db)
                .args(["export", "--caller", "token:tests"])
                .launch_output();
            records = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            records
                .iter()
                .any(|r| r["kind"] == "session" && r["status"] == "complete")
        });
        assert!(closed, "{records:?}");
        server.stop();
        let of = |kind: &str| -> Vec<&Value> {
            records
                .iter()
                .filter(|r| r["kind"] == kind && r["via"] == "mcp")
                .collect()
        };
        assert_eq!(of("run").len(), 2, "{records:?}");
        assert_eq!(of("run")[0]["code"], "y = 5\nprint(y)");
        let calls = of("call");
        assert_eq!(calls.len(), 2, "{records:?}");
        assert!(calls.iter().all(|c| c["session"] == id.as_str()));
        let session = of("session");
        assert_eq!(session.len(), 1, "{records:?}");
        assert_eq!(session[0]["message"], "closed by token:tests (mcp)");
        assert_eq!(session[0]["details"]["executions"], 2);
    });
}

/// A dozen calls as a model would issue them for one task: look around, load data,
/// compute, plot, check with the shell, fix an error, read the result back.
#[test]
fn a_scripted_agent_loop_runs_end_to_end() {
    mcp_test(|python| {
        let steps = json!([
            tool(
                "execute_shell",
                json!({"command": "ls -la /work && python3 --version"})
            ),
            tool(
                "write_file",
                json!({"path": "sales.csv", "content": "month,units\n1,10\n2,14\n3,9\n4,21\n"})
            ),
            tool(
                "execute_python",
                json!({"code": "import pandas as pd\ndf = pd.read_csv('sales.csv')\ndf.describe()"})
            ),
            tool(
                "execute_python",
                json!({"code": "df['units'].sum() / len(df.month)"})
            ),
            tool(
                "execute_python",
                json!({"code": "df.plot(x='month', y='unit')"})
            ),
            tool(
                "execute_python",
                json!({"code": "import matplotlib.pyplot as plt\nax = df.plot(x='month', y='units')\nplt.show()"})
            ),
            tool(
                "execute_python",
                json!({"code": "import os\nos.makedirs('out', exist_ok=True)\ndf.assign(cum=df.units.cumsum()).to_csv('out/cum.csv', index=False)"})
            ),
            tool(
                "execute_shell",
                json!({"command": "wc -l < /work/sales.csv"})
            ),
            tool("list_files", json!({"path": "out"})),
            tool("read_file", json!({"path": "out/cum.csv"})),
            tool(
                "execute_node",
                json!({"code": "const rows = [10, 14, 9, 21]; rows.reduce((a, b) => a + b, 0)"})
            ),
            tool(
                "execute_python",
                json!({"code": "print(f'total {df.units.sum()}')"})
            ),
        ]);
        let results = drive(python, mcp_stdio(&[]), steps);
        assert_eq!(results.len(), 12);
        assert!(text(&results[0]).contains("Python 3"), "{}", results[0]);
        assert!(text(&results[2]).contains("mean"), "{}", results[2]);
        assert!(text(&results[3]).contains("13.5"), "{}", results[3]);
        assert!(
            is_error(&results[4]) && text(&results[4]).contains("KeyError"),
            "{}",
            results[4]
        );
        assert_eq!(blocks(&results[5], "image").len(), 1, "{}", results[5]);
        assert_eq!(
            blocks(&results[6], "resource_link").len(),
            1,
            "{}",
            results[6]
        );
        // The shell is a context of the same sandbox: write_file's file is there.
        assert_eq!(text(&results[7]), "5\n", "{}", results[7]);
        assert!(text(&results[8]).contains("cum.csv"));
        assert!(
            text(&results[9]).starts_with("month,units,cum\n1,10,10\n"),
            "{}",
            results[9]
        );
        assert!(text(&results[10]).contains("54"), "{}", results[10]);
        assert_eq!(text(&results[11]), "total 54\n");
    });
}

#[test]
fn over_stdio_a_request_over_the_size_limit_is_answered_with_an_error_that_names_it() {
    mcp_test(|python| {
        // 20 MiB of content, over the 16 MiB default of mcp.max_request: rmcp's own
        // transport dropped it silently and the client waited for ever.
        let steps = json!([
            tool(
                "write_file",
                json!({"path": "big.txt", "content": "x".repeat(20 << 20)})
            ),
            tool(
                "write_file",
                json!({"path": "small.txt", "content": "fits"})
            ),
            // write_file's session is the Python one (until a session holds every context).
            tool(
                "execute_python",
                json!({"code": "import os; print(open('/work/small.txt').read(), os.listdir('/work'))"})
            ),
        ]);
        let results = drive(python, mcp_stdio(&[]), steps);
        let refused = results[0]["exception"].as_str().unwrap_or_default();
        assert!(
            refused.contains("over the limit of 16M a request may have")
                && refused.contains("mcp.max_request"),
            "{}",
            results[0]
        );
        assert!(!is_error(&results[1]), "{}", results[1]);
        let listing = text(&results[2]);
        assert!(listing.contains("fits"), "{listing}");
        assert!(!listing.contains("big.txt"), "{listing}");
    });
}

/// Finding 2: sandboxed code shows 24 copies of an 11 585 x 11 585 PNG (a few hundred KB
/// each) and the model reads it as a file. The server reads PNG headers only: it decodes
/// nothing, stays small, and answers /healthz at once while the call runs; the images are
/// scaled (or, this large, refused) inside the sandbox.
#[test]
fn a_sandbox_that_shows_huge_pngs_costs_the_server_nothing() {
    mcp_test(|python| {
        let server = Server::start("", true);
        let token = super::server::TOKEN;
        let (status, created) = server.tcp_request(
            token,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python", "timeout": "120s"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let code = r#"import struct, zlib
w = h = 11585
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
packer = zlib.compressobj(9)
row = bytes(1 + 3 * w)
pixels = b"".join(packer.compress(row) for _ in range(h)) + packer.flush()
png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
open("huge.png", "wb").write(png)
class Huge:
    def _repr_png_(self):
        return png
for _ in range(24):
    display(Huge())
len(png)"#;
        let url = format!("http://{}/mcp", server.tcp_address());
        let health = {
            let address = server.tcp_address();
            std::thread::spawn(move || {
                // The slowest /healthz while the call runs.
                let mut slowest = std::time::Duration::ZERO;
                let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while std::time::Instant::now() < end {
                    let started = std::time::Instant::now();
                    let out = Command::new("curl")
                        .args(["-s", "-m", "10", &format!("http://{address}/healthz")])
                        .output()
                        .unwrap();
                    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n");
                    slowest = slowest.max(started.elapsed());
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                slowest
            })
        };
        let results = drive(
            python,
            json!({"http": url, "token": token}),
            json!([
                tool("execute_python", json!({"code": code, "session_id": id})),
                tool("read_file", json!({"path": "huge.png", "session_id": id})),
                tool(
                    "execute_python",
                    json!({"code": "import io\nfrom PIL import Image\nb = io.BytesIO()\nImage.new('RGB', (3000, 2000), (9, 99, 199)).save(b, 'PNG')\nclass Big:\n    def _repr_png_(self):\n        return b.getvalue()\nBig()", "session_id": id}),
                ),
            ]),
        );
        // A large image that can be decoded is scaled down by the driver, in the sandbox.
        let scaled = blocks(&results[2], "image");
        assert_eq!(scaled.len(), 1, "{:.600}", results[2]);
        let png = base64::engine::general_purpose::STANDARD
            .decode(scaled[0]["data"].as_str().unwrap())
            .unwrap();
        assert_eq!(png_size(&png), (1024, 683));
        let shown = &results[0];
        assert!(!is_error(shown), "{shown}");
        assert!(blocks(shown, "image").is_empty(), "{shown:.400}");
        assert!(text(shown).contains("too large to show"), "{shown:.600}");
        let read = text(&results[1]);
        assert!(
            read.contains("11585x11585") && read.contains("not shown as an image"),
            "{read}"
        );
        let slowest = health.join().unwrap();
        let (rss, fds) = server.footprint();
        eprintln!(
            "figures: 24 huge PNGs through MCP: server peak RSS {rss} KiB, {fds} fds, slowest /healthz {slowest:?}"
        );
        assert!(rss < 100 << 10, "peak RSS {rss} KiB");
        assert!(slowest < std::time::Duration::from_secs(1), "{slowest:?}");
        server.stop();
    });
}

/// The same limit at `/mcp` on `codecage serve`: a body over `mcp.max_request` is a 413
/// whose body is the JSON-RPC error for that request's id (read from its start).
#[test]
fn over_http_a_request_over_the_size_limit_is_answered_with_a_json_rpc_error() {
    as_root(|| {
        let server = Server::start("[mcp]\nmax_request = \"1M\"\n", false);
        let dir = TempDir::new("mcp-big");
        let body = dir.path().join("body.json");
        let request = json!({
            "jsonrpc": "2.0", "id": 77, "method": "tools/call",
            "params": {"name": "write_file", "arguments": {"path": "big.txt", "content": "x".repeat(2 << 20)}}
        });
        std::fs::write(&body, request.to_string()).unwrap();
        let (status, answer) = server.curl(&[
            "-X",
            "POST",
            "http://codecage/mcp",
            "-H",
            "Content-Type: application/json",
            "-H",
            "Accept: application/json, text/event-stream",
            "--data-binary",
            &format!("@{}", body.display()),
        ]);
        assert_eq!(status, 413, "{answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["id"], 77, "{answer}");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("over the limit of 1M") && message.contains("mcp.max_request"),
            "{message}"
        );
        server.stop();
    });
}

/// The same through the HTTP API (`"format"` on `POST /v1/run` and on a session's execute)
/// and MCP (the execute tools' `format` argument), with the image; a bad channel is a 400
/// that names the allowed ones.
#[test]
fn a_result_formatted_for_a_chat_channel_through_the_http_api_and_mcp() {
    super::image::image_test(|_| {
        let server = Server::start("", false);
        let (status, run) = server.request(
            "POST",
            "/v1/run",
            Some(serde_json::json!({"language": "python", "code": "print('<b>hi</b>')", "format": "telegram"})),
        );
        assert_eq!(status, 200, "{run}");
        assert_eq!(
            run["formatted"]["messages"][0],
            "<pre><code class=\"language-python\">&lt;b&gt;hi&lt;/b&gt;\n</code></pre>",
            "{run}"
        );
        let (status, refused) = server.request(
            "POST",
            "/v1/run",
            Some(serde_json::json!({"language": "python", "code": "1", "format": "teams"})),
        );
        assert_eq!(status, 400, "{refused}");
        assert!(
            refused.to_string().contains("discord, telegram, slack"),
            "{refused}"
        );
        let (_, created) = server.request(
            "POST",
            "/v1/sessions",
            Some(serde_json::json!({"language": "python"})),
        );
        let id = created["id"].as_str().unwrap();
        let (status, call) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(serde_json::json!({"code": "1/0", "format": {"channel": "discord"}})),
        );
        assert_eq!(status, 200, "{call}");
        let message = call["formatted"]["messages"][0].as_str().unwrap();
        assert!(message.contains("ZeroDivisionError"), "{message}");
        assert!(message.matches("```").count() % 2 == 0, "{message}");
        server.stop();
        let python = match mcp_python() {
            Ok(python) => python,
            Err(why) => return unavailable(&why),
        };
        let results = drive(
            &python,
            mcp_stdio(&[]),
            serde_json::json!([
                {"tool": "execute_python", "args": {"code": "print('a_b *c*')", "format": "slack"}},
                {"tool": "execute_python", "args": {"code": "1", "format": "teams"}},
            ]),
        );
        let blocks = results[0]["content"].as_array().unwrap();
        assert_eq!(blocks[0]["type"], "text", "{}", results[0]);
        assert_eq!(blocks[0]["text"], "```\na_b *c*\n```", "{}", results[0]);
        assert_eq!(results[1]["isError"], true, "{}", results[1]);
    });
}

/// The output lines of an `exec`/`process` answer: its text without the bracketed notes.
fn output_lines(result: &Value) -> String {
    text(result)
        .lines()
        .filter(|l| !l.starts_with('[') && *l != "(no new output)")
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `exec` and `process` (issue 24) driven by the SDK client over stdio: a build-like
/// command goes to the background after yieldMs and is polled to its end with every line
/// exactly once (and again from a cursor, as a client that reconnects); `write` feeds
/// `cat`; `kill` ends `sleep 100`; a server started in the background answers a client
/// started by a later exec; the connection's exec and execute_shell share one sandbox;
/// the exits of background processes are told once in a later result (`notifyOnExit`).
#[test]
fn exec_goes_to_the_background_and_process_polls_feeds_and_kills_it() {
    mcp_test(|python| {
        let port = 19000 + (std::process::id() % 1000);
        let poll = |id: u64| {
            tool(
                "process",
                json!({"action": "poll", "sessionId": id.to_string()}),
            )
        };
        let repeat = |id: u64, until: &str| {
            json!({"repeat": {"tool": "process", "args": {"action": "poll", "sessionId": id}},
                   "until": until, "every": 1.5, "max": 40})
        };
        let client = format!(
            "python3 -c \"import time, urllib.request\nfor _ in range(100):\n    try:\n        \
             r = urllib.request.urlopen('http://127.0.0.1:{port}/'); break\n    except OSError:\n        \
             time.sleep(0.1)\nprint(r.status, b'Directory listing' in r.read())\""
        );
        let steps = json!([
            {"list_tools": true},
            tool("exec", json!({"command": "for i in $(seq 30); do echo $i; sleep 0.2; done", "yieldMs": 1000})),
            repeat(1, "exited"),
            tool("process", json!({"action": "poll", "sessionId": 1, "cursor": "6:0"})),
            tool("process", json!({"action": "log", "sessionId": 1, "limit": 5})),
            tool("exec", json!({"command": "cat", "background": true})),
            tool("process", json!({"action": "write", "sessionId": 2, "data": "hello\n"})),
            repeat(2, "hello"),
            tool("process", json!({"action": "write", "sessionId": 2, "data": "bye\n", "eof": true})),
            repeat(2, "exited"),
            tool("exec", json!({"command": "sleep 100", "background": true})),
            tool("process", json!({"action": "kill", "sessionId": 3})),
            tool("exec", json!({"command": format!("python3 -m http.server {port} --bind 127.0.0.1"), "background": true})),
            tool("exec", json!({"command": client, "yieldMs": 30000})),
            tool("process", json!({"action": "kill", "sessionId": 4, "signal": "TERM"})),
            tool("process", json!({"action": "list"})),
            tool("exec", json!({"command": "echo made > shared.txt; pwd; exit 3", "workdir": "/work"})),
            tool("execute_shell", json!({"command": "cat /work/shared.txt"})),
            poll(99),
            tool("exec", json!({"command": "true", "env": {"LD_PRELOAD": "/x.so"}})),
            tool("exec", json!({"command": "sleep 0.3; exit 7", "background": true})),
            tool("exec", json!({"command": "sleep 2; echo slept", "yieldMs": 10000})),
            tool("process", json!({"action": "list"})),
        ]);
        let results = drive(python, mcp_stdio(&[]), steps);
        // The schemas: the seeds' names.
        let tools = results[0]["tools"].as_array().unwrap();
        let exec = tools.iter().find(|t| t["name"] == "exec").unwrap();
        let properties = exec["inputSchema"]["properties"].as_object().unwrap();
        for name in [
            "command",
            "workdir",
            "env",
            "yieldMs",
            "background",
            "timeout",
            "pty",
        ] {
            assert!(properties.contains_key(name), "{name}: {exec}");
        }
        assert_eq!(exec["inputSchema"]["required"], json!(["command"]));
        let process = tools.iter().find(|t| t["name"] == "process").unwrap();
        let schema = process["inputSchema"].to_string();
        assert!(
            schema.contains("sessionId") && schema.contains("\"poll\""),
            "{schema}"
        );
        for action in ["send-keys", "paste", "submit", "screen"] {
            assert!(schema.contains(action), "{action}: {schema}");
        }
        // The build-like command: running after about a second, then polled to its end.
        let first = &results[1];
        assert!(!is_error(first), "{first}");
        assert!(
            text(first).contains("sessionId 1") && text(first).contains("running"),
            "{first}"
        );
        let polls = results[2]["results"].as_array().unwrap();
        assert!(polls.len() >= 2, "{}", results[2]);
        let last = polls.last().unwrap();
        assert!(
            text(last).contains("exited with status 0"),
            "{}",
            results[2]
        );
        let mut all = output_lines(first);
        for p in polls {
            all.push_str(&output_lines(p));
        }
        let expected: String = (1..=30).map(|i| format!("{i}\n")).collect();
        assert_eq!(all, expected, "every line exactly once: {}", results[2]);
        assert!(text(last).contains("[cursor 81:0]"), "{last}");
        // From a cursor given back (a client that reconnects): from there, once.
        let expected_from_4: String = (4..=30).map(|i| format!("{i}\n")).collect();
        assert_eq!(output_lines(&results[3]), expected_from_4, "{}", results[3]);
        // The log: the last five lines.
        let log = text(&results[4]);
        assert!(log.contains("lines 25-29 of the 30 kept"), "{log}");
        assert_eq!(output_lines(&results[4]), "26\n27\n28\n29\n30\n", "{log}");
        // cat echoes what is written, and ends at the end of its stdin.
        assert!(text(&results[5]).contains("sessionId 2"), "{}", results[5]);
        assert!(
            text(&results[6]).contains("wrote 6 bytes"),
            "{}",
            results[6]
        );
        let echoed = results[7]["results"].as_array().unwrap();
        assert!(
            text(echoed.last().unwrap()).starts_with("hello\n"),
            "{}",
            results[7]
        );
        assert!(text(&results[8]).contains("closed it"), "{}", results[8]);
        let ended = results[9]["results"].as_array().unwrap();
        let ended = ended.last().unwrap();
        assert!(text(ended).starts_with("bye\n"), "{ended}");
        assert!(text(ended).contains("exited with status 0"), "{ended}");
        // kill: sleep 100 ends at once.
        assert!(
            text(&results[10]).contains("sessionId 3"),
            "{}",
            results[10]
        );
        assert!(
            text(&results[11]).contains("was killed by SIGKILL"),
            "{}",
            results[11]
        );
        // A server in the background answers a client from a later exec.
        assert!(
            text(&results[12]).contains("sessionId 4"),
            "{}",
            results[12]
        );
        assert!(!is_error(&results[13]), "{}", results[13]);
        assert!(
            text(&results[13]).starts_with("200 True\n"),
            "{}",
            results[13]
        );
        assert!(
            text(&results[14]).contains("was killed by SIGTERM"),
            "{}",
            results[14]
        );
        let list = text(&results[15]);
        assert_eq!(
            list.lines().filter(|l| l.starts_with("sessionId")).count(),
            5,
            "{list}"
        );
        assert!(
            list.contains("sessionId 3: was killed by SIGKILL"),
            "{list}"
        );
        // A failing command is an error with its status; exec and execute_shell share /work.
        assert!(is_error(&results[16]), "{}", results[16]);
        assert!(
            text(&results[16]).starts_with("/work\n")
                && text(&results[16]).contains("exited with status 3"),
            "{}",
            results[16]
        );
        assert_eq!(text(&results[17]), "made\n", "{}", results[17]);
        // Refusals that say what was wrong.
        assert!(
            is_error(&results[18]) && text(&results[18]).contains("no process 99"),
            "{}",
            results[18]
        );
        assert!(
            is_error(&results[19]) && text(&results[19]).contains("[policy]"),
            "{}",
            results[19]
        );
        // notifyOnExit: a process that ended in the background while no result was about
        // it is told of once, in the next exec or process result; those a result showed
        // ending are not told again.
        let told = "[background process sessionId 7 exited with status 7 after";
        assert!(text(&results[21]).starts_with("slept\n"), "{}", results[21]);
        assert!(text(&results[21]).contains(told), "{}", results[21]);
        let all = serde_json::to_string(&results).unwrap();
        assert_eq!(all.matches(told).count(), 1, "{all}");
        for id in [1, 2, 3, 4, 5, 6, 8] {
            let never = format!("[background process sessionId {id} ");
            assert_eq!(all.matches(&never).count(), 0, "{never}: {all}");
        }
    });
}

/// `exec` with `pty: true` and `process` send-keys, paste, submit and screen (the seeds'
/// examples) driven by the SDK client: Python's REPL on a terminal takes a pasted line
/// and Enter and its screen shows 42; `C-c` stops `sleep 100` on a terminal by SIGINT;
/// `C-d` ends the REPL; keys for a process that is not there, or no keys, say so.
#[test]
fn exec_on_a_terminal_takes_keys_and_shows_its_screen() {
    mcp_test(|python| {
        let screen_until = |id: u64, until: &str| {
            json!({"repeat": {"tool": "process", "args": {"action": "screen", "sessionId": id}},
                   "until": until, "every": 0.3, "max": 60})
        };
        let poll_until = |id: u64, until: &str| {
            json!({"repeat": {"tool": "process", "args": {"action": "poll", "sessionId": id}},
                   "until": until, "every": 0.3, "max": 60})
        };
        let steps = json!([
            tool(
                "exec",
                json!({"command": "python3 -i -q", "pty": true, "background": true})
            ),
            screen_until(1, ">>>"),
            tool(
                "process",
                json!({"action": "paste", "sessionId": 1, "text": "print(6*7)"})
            ),
            tool("process", json!({"action": "submit", "sessionId": 1})),
            screen_until(1, "\n42\n"),
            tool(
                "exec",
                json!({"command": "sleep 100", "pty": true, "background": true})
            ),
            tool(
                "process",
                json!({"action": "send-keys", "sessionId": 2, "keys": ["C-c"]})
            ),
            poll_until(2, "killed by"),
            tool(
                "process",
                json!({"action": "send-keys", "sessionId": 1, "keys": ["C-d"]})
            ),
            poll_until(1, "exited"),
            tool(
                "process",
                json!({"action": "send-keys", "sessionId": 9, "keys": ["Enter"]})
            ),
            tool("process", json!({"action": "send-keys", "sessionId": 1})),
            tool(
                "process",
                json!({"action": "send-keys", "sessionId": 1, "keys": ["C-nothing"]})
            ),
        ]);
        let results = drive(python, mcp_stdio(&[]), steps);
        assert!(!is_error(&results[0]), "{}", results[0]);
        assert!(text(&results[0]).contains("sessionId 1"), "{}", results[0]);
        let last = |r: &Value| text(r["results"].as_array().unwrap().last().unwrap());
        assert!(last(&results[1]).starts_with(">>>\n"), "{}", results[1]);
        assert!(!is_error(&results[2]), "{}", results[2]);
        assert!(!is_error(&results[3]), "{}", results[3]);
        let screen = last(&results[4]);
        assert!(screen.contains(">>> print(6*7)\n42\n"), "{screen}");
        assert!(
            screen.contains("[screen 80x24; cursor at row 2"),
            "{screen}"
        );
        assert!(
            last(&results[7]).contains("was killed by SIGINT"),
            "{}",
            results[7]
        );
        assert!(
            last(&results[9]).contains("exited with status 0"),
            "{}",
            results[9]
        );
        assert!(
            is_error(&results[10]) && text(&results[10]).contains("no process 9"),
            "{}",
            results[10]
        );
        assert!(
            is_error(&results[11]) && text(&results[11]).contains("give `keys`"),
            "{}",
            results[11]
        );
        assert!(
            is_error(&results[12]) && text(&results[12]).contains("C-nothing"),
            "{}",
            results[12]
        );
    });
}

/// Over HTTP `exec` needs a `session_id`; a client that reconnects polls on from where
/// its caller's last poll ended (no gap, no repeat), and another caller reaches nothing.
#[test]
fn over_http_exec_needs_a_session_and_a_reconnecting_client_resumes() {
    mcp_test(|python| {
        const OTHER: &str = "other-token-0123456789abcdef";
        let server = Server::start(
            &format!("[[tokens]]\nname = \"other\"\ntoken = \"{OTHER}\"\n"),
            true,
        );
        let (status, created) = server.tcp_request(
            super::server::TOKEN,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let url = format!("http://{}/mcp", server.tcp_address());
        let mine = json!({"http": url, "token": super::server::TOKEN});
        let build = "for i in $(seq 30); do echo $i; sleep 0.2; done";
        let first = drive(
            python,
            mine.clone(),
            json!([
                tool("exec", json!({"command": "true"})),
                tool("exec", json!({"command": build, "yieldMs": 1000, "session_id": id})),
                {"repeat": {"tool": "process", "args": {"action": "poll", "sessionId": 1, "session_id": id}},
                 "until": "[cursor", "every": 1.0, "max": 1},
            ]),
        );
        assert!(
            is_error(&first[0]) && text(&first[0]).contains("session_id"),
            "{}",
            first[0]
        );
        assert!(text(&first[1]).contains("running"), "{}", first[1]);
        let polled = &first[2]["results"][0];
        assert!(text(polled).contains("running"), "{polled}");
        // A new connection: the poll goes on from there.
        let second = drive(
            python,
            mine,
            json!([
                {"repeat": {"tool": "process", "args": {"action": "poll", "sessionId": "1", "session_id": id}},
                 "until": "exited", "every": 1.5, "max": 40},
                tool("process", json!({"action": "list", "session_id": id})),
            ]),
        );
        let mut all = output_lines(&first[1]) + &output_lines(polled);
        for p in second[0]["results"].as_array().unwrap() {
            all.push_str(&output_lines(p));
        }
        let expected: String = (1..=30).map(|i| format!("{i}\n")).collect();
        assert_eq!(all, expected, "{}", second[0]);
        assert!(
            text(&second[1]).contains("sessionId 1: exited with status 0"),
            "{}",
            second[1]
        );
        // Another caller: the session is not theirs.
        let theirs = drive(
            python,
            json!({"http": url, "token": OTHER}),
            json!([tool(
                "process",
                json!({"action": "poll", "sessionId": 1, "session_id": id})
            )]),
        );
        assert!(
            is_error(&theirs[0]) && text(&theirs[0]).contains("[not_found]"),
            "{}",
            theirs[0]
        );
        server.stop();
    });
}

/// One stdio connection, one sandbox: execute_shell, execute_python and execute_node are
/// contexts of the same session, so each sees the others' files in /work while keeping
/// its own variables; reset_repl with a language restarts that one only, without one
/// every one. The session is closed with the connection (the harness checks the host).
#[test]
fn over_stdio_the_execute_tools_share_one_sandbox() {
    mcp_test(|python| {
        let steps = json!([
            tool(
                "execute_shell",
                json!({"command": "echo from-shell > shared.txt; v=shellvar; echo ok"})
            ),
            tool(
                "execute_python",
                json!({"code": "v = 'pyvar'\nopen('from_py.txt', 'w').write('from-python')\nprint(open('shared.txt').read().strip())"})
            ),
            tool(
                "execute_node",
                json!({"code": "const fs = require('fs'); console.log(fs.readFileSync('from_py.txt', 'utf8'), typeof v)"})
            ),
            tool("reset_repl", json!({"language": "shell"})),
            tool(
                "execute_shell",
                json!({"command": "echo \"[$v]\"; cat from_py.txt"})
            ),
            tool("execute_python", json!({"code": "print(v)"})),
            tool("list_files", json!({})),
            tool("reset_repl", json!({})),
            tool("execute_python", json!({"code": "print('v' in dir())"})),
        ]);
        let out = drive(python, mcp_stdio(&[]), steps);
        let texts: Vec<String> = out.iter().map(text).collect();
        for (i, result) in out.iter().enumerate() {
            assert!(!is_error(result), "step {i}: {result}");
        }
        assert!(texts[0].contains("ok"), "{}", texts[0]);
        assert!(texts[1].contains("from-shell"), "{}", texts[1]);
        assert!(texts[2].contains("from-python undefined"), "{}", texts[2]);
        assert!(
            texts[3].contains("the other languages' are kept"),
            "{}",
            texts[3]
        );
        assert!(
            texts[4].contains("[]") && texts[4].contains("from-python"),
            "{}",
            texts[4]
        );
        assert!(texts[5].contains("pyvar"), "{}", texts[5]);
        assert!(
            texts[6].contains("shared.txt") && texts[6].contains("from_py.txt"),
            "{}",
            texts[6]
        );
        assert!(texts[8].contains("False"), "{}", texts[8]);
    });
}

/// A shell profile that says `[exec] security = "deny"`: the MCP server neither lists
/// nor runs `execute_shell`; the other tools are there.
#[test]
fn a_deny_shell_profile_hides_execute_shell() {
    mcp_test(|python| {
        let server = Server::start("", true);
        std::fs::write(
            server.profiles_dir().join("bash.toml"),
            "language = \"bash\"\n[exec]\nsecurity = \"deny\"\n",
        )
        .unwrap();
        let url = format!("http://{}/mcp", server.tcp_address());
        let results = drive(
            python,
            json!({"http": url, "token": super::server::TOKEN}),
            json!([{"list_tools": true}]),
        );
        let tools = results[0]["tools"].as_array().unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        for hidden in ["execute_shell", "exec", "process"] {
            assert!(!names.contains(&hidden), "{hidden}: {names:?}");
        }
        assert!(names.contains(&"execute_python"), "{names:?}");
        server.stop();
    });
}

/// `[exec] ask` through MCP's exec tool (issue 25): a command that waits answers
/// `[approval pending]` with the approval's id (not an error: nothing failed); polling that
/// id says it is pending, and once a person approves (root on the socket), gives the
/// process's output.
#[test]
fn exec_waits_for_approval_and_the_approval_id_polls_the_process() {
    mcp_test(|python| {
        let server = Server::start("", true);
        std::fs::write(
            server.profiles_dir().join("bash.toml"),
            "language = \"bash\"\n[exec]\nask = \"on-miss\"\nallowed = [\"bash\", \"ls\"]\n",
        )
        .unwrap();
        let (status, created) = server.tcp_request(
            super::server::TOKEN,
            "POST",
            "/v1/sessions",
            Some(json!({"language": "bash"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let url = format!("http://{}/mcp", server.tcp_address());
        let mine = json!({"http": url, "token": super::server::TOKEN});
        let first = drive(
            python,
            mine.clone(),
            json!([tool(
                "exec",
                json!({"command": "touch /work/m && ls /work", "session_id": id})
            )]),
        );
        let said = text(&first[0]);
        assert!(
            !is_error(&first[0]) && said.contains("[approval pending]"),
            "{said}"
        );
        assert!(said.contains("not in exec.allowed: touch"), "{said}");
        let approval = said
            .split_whitespace()
            .nth(3)
            .unwrap()
            .trim_end_matches(':')
            .to_string();
        assert_eq!(approval.len(), 32, "{said}");
        let pending = drive(
            python,
            mine.clone(),
            json!([tool(
                "process",
                json!({"action": "poll", "sessionId": approval, "session_id": id})
            )]),
        );
        assert!(
            text(&pending[0]).contains("still pending"),
            "{}",
            pending[0]
        );
        let (status, out) = server.request(
            "POST",
            &format!("/v1/approvals/{approval}"),
            Some(json!({"decision": "allow-once"})),
        );
        assert_eq!(status, 200, "{out}");
        let polled = drive(
            python,
            mine,
            json!([{"repeat": {"tool": "process", "args": {"action": "poll", "sessionId": approval, "session_id": id}},
                    "until": "exited", "every": 0.5, "max": 20}]),
        );
        let all: String = polled[0]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(output_lines)
            .collect();
        assert_eq!(all, "m\n", "{}", polled[0]);
        server.stop();
    });
}
