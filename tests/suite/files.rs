//! Files in and out: inputs written into /work before the code runs, outputs taken back
//! from the profile's output directory by the sandbox's init (never following a link,
//! never leaving /work, never blocking), over the CLI, the library and the API.

use std::os::unix::fs::symlink;

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::Digest as _;

use super::common::*;
use super::image::{image_test, in_image};
use super::server::Server;

fn decode(file: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(file["data"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("not base64 ({e}): {file}"))
}

fn sha256_hex(data: &[u8]) -> String {
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The output file at `path` in a run's answer.
fn output<'a>(run: &'a Value, path: &str) -> &'a Value {
    run["files"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("no output file {path}: {run}"))
}

/// The reason `path` was skipped, or None if it was not.
fn skipped<'a>(run: &'a Value, path: &str) -> Option<&'a str> {
    run["files_skipped"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["path"] == path)
        .and_then(|f| f["reason"].as_str())
}

#[test]
fn a_plot_and_a_csv_come_back_with_their_sha256_and_media_type() {
    image_test(|_| {
        let code = "import hashlib, os\n\
                    import matplotlib.pyplot as plt, pandas as pd\n\
                    os.makedirs('out/tables', exist_ok=True)\n\
                    plt.plot([1, 2, 3], [3, 1, 2]); plt.savefig('out/plot.png')\n\
                    pd.DataFrame({'a': range(100), 'b': range(100)}).to_csv('out/tables/t.csv', index=False)\n\
                    for p in ['out/plot.png', 'out/tables/t.csv']:\n    \
                        print(p, hashlib.sha256(open(p, 'rb').read()).hexdigest())";
        let run = in_image(&["--lang", "python", "--timeout", &secs(60), "-c", code]);
        assert_eq!(run.exit_code(), Some(0), "{}", run.json);
        for (line, (path, media)) in run
            .stdout()
            .lines()
            .zip([("plot.png", "image/png"), ("tables/t.csv", "text/csv")])
        {
            let inside = line.split_whitespace().nth(1).unwrap();
            let file = output(&run.json, path);
            let data = decode(file);
            assert_eq!(file["media_type"], media, "{file}");
            assert_eq!(
                file["sha256"], inside,
                "the sha256 differs from the sandbox's"
            );
            assert_eq!(
                sha256_hex(&data),
                inside,
                "the bytes differ from the sandbox's"
            );
            assert_eq!(file["size"], data.len() as u64);
        }
        assert!(decode(output(&run.json, "plot.png")).starts_with(b"\x89PNG"));
    });
}

#[test]
fn planted_links_fifos_oversize_files_and_wrong_types_are_skipped_with_a_reason() {
    as_root(|| {
        let code = r#"
import os
os.makedirs("/work/out", exist_ok=True)
os.symlink("/etc/passwd", "/work/out/passwd.txt")
os.symlink("/proc/1/environ", "/work/out/environ.txt")
open("/tmp/t.txt", "w").write("in tmp")
os.symlink("/tmp/t.txt", "/work/out/tmp.txt")
os.makedirs("/work/out/linked", exist_ok=True)
os.symlink("/etc", "/work/out/etc")
open("/work/secret.txt", "w").write("outside the output directory")
os.link("/work/secret.txt", "/work/out/hard.txt")
os.mkfifo("/work/out/fifo.txt")
open("/work/out/big.txt", "wb").write(b"x" * (5 * 1024 * 1024 + 1))
open("/work/out/tool.exe", "wb").write(b"MZ")
open("/work/out/ok.txt", "w").write("fine")
"#;
        let run = run_json(&["--lang", "python", "-c", code]);
        assert_eq!(run.exit_code(), Some(0), "{}", run.json);
        for (path, reason) in [
            ("passwd.txt", "symlink"),
            ("environ.txt", "symlink"),
            ("tmp.txt", "symlink"),
            ("etc", "symlink"),
            ("hard.txt", "hard_link"),
            ("fifo.txt", "not_regular"),
            ("big.txt", "size"),
            ("tool.exe", "pattern"),
        ] {
            assert_eq!(
                skipped(&run.json, path),
                Some(reason),
                "{path}: {}",
                run.json
            );
        }
        let files = run.json["files"].as_array().unwrap();
        assert_eq!(files.len(), 1, "only ok.txt comes back: {}", run.json);
        assert_eq!(decode(output(&run.json, "ok.txt")), b"fine");
        let text = run.json.to_string();
        assert!(!text.contains("root:x:0"), "a byte of /etc/passwd leaked");
    });
}

#[test]
fn bad_input_names_are_refused_and_nothing_runs() {
    as_root(|| {
        let src = TempDir::new("inputs");
        let file = src.path().join("in.txt");
        std::fs::write(&file, "data").unwrap();
        let marker = src.path().join("ran");
        for dest in ["../../etc/x", "/abs", "a/../b", "a//b", "line\nbreak"] {
            let out = codecage_run()
                .arg("--json")
                .arg("--file")
                .arg(format!("{dest}={}", file.display()))
                .args(["--", "touch"])
                .arg(&marker)
                .launch_output();
            let run = parse(out);
            assert_eq!(
                run.error(),
                Some("invalid_request"),
                "{dest:?}: {}",
                run.json
            );
            let message = run.json["message"].as_str().unwrap();
            assert!(message.contains("--file"), "{message}");
            assert!(
                message.contains(&format!("{dest:?}")),
                "names the file: {message}"
            );
        }
        // Through the API, the same rules; a NUL byte can only come that way.
        let server = Server::start("", false);
        for (name, rule) in [
            ("a\u{0}b", "control character"),
            ("x\ny", "control character"),
            ("../../etc/x", "`..`"),
            ("/abs", "absolute"),
        ] {
            let (status, out) = server.request(
                "POST",
                "/v1/run",
                Some(json!({"language": "bash", "code": "echo ran",
                    "files": [{"path": name, "data": "eA=="}]})),
            );
            assert_eq!(status, 400, "{name:?}: {out}");
            let message = out["message"].as_str().unwrap();
            assert!(message.contains(rule), "{name:?}: {message}");
            assert!(message.contains("files"), "names the field: {message}");
        }
        server.stop();
        assert!(!marker.exists());
    });
}

#[test]
fn inputs_are_in_work_before_the_code_runs_and_over_the_caps_are_refused() {
    as_root(|| {
        let src = TempDir::new("inputs");
        let file = src.path().join("in.csv");
        std::fs::write(&file, "a,b\n1,2\n").unwrap();
        let run = run_json(&[
            "--file",
            &format!("data/in.csv={}", file.display()),
            "--",
            "cat",
            "/work/data/in.csv",
        ]);
        assert_eq!(run.stdout(), "a,b\n1,2\n", "{}", run.json);
        // More files than the profile's inputs.max_files.
        let profile = src.path().join("few.toml");
        std::fs::write(&profile, "language = \"bash\"\n[inputs]\nmax_files = 2\n").unwrap();
        let mut args = vec!["--profile".to_string(), profile.display().to_string()];
        for i in 0..3 {
            args.push("--file".into());
            args.push(format!("f{i}={}", file.display()));
        }
        args.extend(["--".into(), "true".into()]);
        let run = run_json(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(run.error(), Some("invalid_request"), "{}", run.json);
        assert!(
            run.json["message"].as_str().unwrap().contains("max_files"),
            "{}",
            run.json
        );
    });
}

#[test]
fn ten_thousand_tiny_outputs_stop_at_the_caps() {
    as_root(|| {
        let dir = TempDir::new("caps");
        let profile = dir.path().join("caps.toml");
        // 10 000 files of 1 KiB: the count cap (1000 by default) and a total cap of 600 KiB.
        std::fs::write(
            &profile,
            "language = \"python\"\n[outputs]\nmax_total_size = \"600K\"\n",
        )
        .unwrap();
        let code = "import os\nos.makedirs('/work/out')\n\
                    for i in range(10000):\n    open(f'/work/out/{i:05}.txt', 'wb').write(b'x' * 1024)";
        let run = run_json(&[
            "--profile",
            profile.to_str().unwrap(),
            "--timeout",
            &secs(60),
            "-c",
            code,
        ]);
        assert_eq!(run.exit_code(), Some(0), "{}", run.json["message"]);
        let files = run.json["files"].as_array().unwrap();
        let total: u64 = files.iter().map(|f| f["size"].as_u64().unwrap()).sum();
        assert_eq!(files.len(), 600, "600 KiB of 1 KiB files");
        assert!(total <= 600 * 1024);
        let skipped = run.json["files_skipped"].as_array().unwrap();
        assert!(
            skipped.iter().any(|s| s["reason"] == "total_cap"),
            "{:?}",
            &skipped[..3]
        );
        // The count cap: the default profile's 1000 files.
        let run = run_json(&["--lang", "python", "--timeout", &secs(60), "-c", code]);
        let files = run.json["files"].as_array().unwrap();
        assert_eq!(files.len(), 1000, "{}", run.json["message"]);
        let skipped = run.json["files_skipped"].as_array().unwrap();
        assert!(skipped.iter().any(|s| s["reason"] == "count_cap"));
        // The list of what was skipped is bounded too, not 9 000 entries long.
        assert!(skipped.len() <= 1000, "{} skipped entries", skipped.len());
    });
}

#[test]
fn out_dir_never_writes_outside_the_directory() {
    as_root(|| {
        let dir = TempDir::new("outdir");
        let out = dir.path().join("out");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let victim = outside.join("victim.txt");
        std::fs::write(&victim, "untouched").unwrap();
        // Links planted in DIR by someone else: a file and a directory that point outside.
        symlink(&victim, out.join("report.txt")).unwrap();
        symlink(&outside, out.join("sub")).unwrap();
        let code = "mkdir -p /work/out/sub && echo new > /work/out/report.txt && echo deep > /work/out/sub/x.txt && echo ok > /work/out/plain.txt";
        let output = codecage_run()
            .arg("--out-dir")
            .arg(&out)
            .args(["--", "bash", "-c", code])
            .launch_output();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert!(!outside.join("x.txt").exists(), "{stderr}");
        // The planted file link was replaced, not followed.
        let report = out.join("report.txt");
        assert!(!report.symlink_metadata().unwrap().is_symlink(), "{stderr}");
        assert_eq!(std::fs::read_to_string(&report).unwrap(), "new\n");
        assert!(
            stderr.contains("sub/x.txt"),
            "the refusal names the file: {stderr}"
        );
        // Output names from a sandbox are checked as input names are.
        let bad = codecage::files::OutputFile {
            path: "../escape.txt".into(),
            size: 1,
            media_type: "text/plain".into(),
            sha256: String::new(),
            data: Some(b"x".to_vec()),
        };
        assert!(codecage::files::save_under(&out, &[bad]).is_err());
        assert!(!dir.path().join("escape.txt").exists());
    });
}

#[test]
fn a_file_that_keeps_growing_is_read_up_to_the_cap_and_the_call_returns() {
    as_root(|| {
        // A run: a background writer outlives the program; the collection happens after
        // every process is gone, so the file is whatever size it reached, within the cap.
        let code = "mkdir -p /work/out; (while :; do echo 0123456789abcdef; done >> /work/out/grow.txt) & sleep 0.3";
        let run = bash(&[], code);
        assert_eq!(run.exit_code(), Some(0), "{}", run.json);
        let in_files = run.json["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "grow.txt");
        assert!(in_files || skipped(&run.json, "grow.txt") == Some("size"));
        // A session: the writer keeps running while the init reads the file.
        let server = Server::start("", false);
        let (status, created) =
            server.request("POST", "/v1/sessions", Some(json!({"language": "bash"})));
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap();
        let execute = format!("/v1/sessions/{id}/execute");
        let (status, out) = server.request(
            "POST",
            &execute,
            Some(json!({"code": "mkdir -p out; (while :; do echo 0123456789abcdef; done >> out/grow.txt) & sleep 0.5"})),
        );
        assert_eq!(status, 200, "{out}");
        let cap = 5 * 1024 * 1024;
        for file in out["files"].as_array().unwrap() {
            assert!(file["size"].as_u64().unwrap() <= cap, "{file}");
        }
        // The download is capped as well.
        let (status, body) = server.curl(&[&format!(
            "http://codecage/v1/sessions/{id}/files/out/grow.txt"
        )]);
        assert!(
            status == 200 && body.len() as u64 <= cap || status == 400 && body.contains("cap"),
            "{status} {}",
            &body[..body.len().min(200)]
        );
        server.stop();
    });
}

#[test]
fn a_session_uploads_a_csv_pandas_reads_it_and_the_api_downloads_the_result() {
    image_test(|_| {
        let server = Server::start("", false);
        let (status, created) = server.request(
            "POST",
            "/v1/sessions",
            Some(json!({"language": "python", "memory": "1G"})),
        );
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let dir = TempDir::new("session-files");
        let csv = dir.path().join("in.csv");
        std::fs::write(&csv, "a,b\n1,2\n3,4\n").unwrap();
        // Upload with curl.
        let (status, body) = server.curl(&[
            "-X",
            "PUT",
            "--data-binary",
            &format!("@{}", csv.display()),
            &format!("http://codecage/v1/sessions/{id}/files/data/in.csv"),
        ]);
        assert_eq!(status, 204, "{body}");
        let (status, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "import os, pandas as pd\n\
                                 df = pd.read_csv('data/in.csv'); df['c'] = df.a + df.b\n\
                                 os.makedirs('out', exist_ok=True); df.to_csv('out/result.csv', index=False)\n\
                                 int(df.c.sum())", "timeout": "60s"})),
        );
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["result"]["text/plain"], "10", "{out}");
        let file = output(&out, "result.csv");
        let expected = b"a,b,c\n1,2,3\n3,4,7\n";
        assert_eq!(decode(file), expected);
        // The next call returns only what it changed.
        let (_, out) = server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "open('out/more.txt', 'w').write('more')"})),
        );
        let paths: Vec<&str> = out["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, ["more.txt"], "{out}");
        // Download with curl: the bytes and the media type.
        let (status, headers) = server.curl(&[
            "-D",
            "-",
            "-o",
            "/dev/null",
            &format!("http://codecage/v1/sessions/{id}/files/out/result.csv"),
        ]);
        assert_eq!(status, 200);
        assert!(
            headers.to_lowercase().contains("content-type: text/csv"),
            "{headers}"
        );
        let (_, body) = server.curl(&[&format!(
            "http://codecage/v1/sessions/{id}/files/out/result.csv"
        )]);
        assert_eq!(body.as_bytes(), expected);
        // The listing.
        let (status, list) =
            server.request("GET", &format!("/v1/sessions/{id}/files?path=out"), None);
        assert_eq!(status, 200, "{list}");
        let entry = list
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "result.csv")
            .unwrap_or_else(|| panic!("{list}"));
        assert_eq!(
            (entry["type"].as_str(), entry["size"].as_u64()),
            (Some("file"), Some(expected.len() as u64))
        );
        assert!(entry["mtime"].is_string(), "{entry}");
        // The same from the shell: put, ls, get.
        let (status, _, err) = server.session_cli(&["put", &id, csv.to_str().unwrap(), "copy.csv"]);
        assert_eq!(status, 0, "{err}");
        let (status, listing, err) = server.session_cli(&["ls", &id]);
        assert_eq!(status, 0, "{err}");
        assert!(
            listing.contains("copy.csv") && listing.contains("data"),
            "{listing}"
        );
        let fetched = dir.path().join("result.csv");
        let (status, _, err) =
            server.session_cli(&["get", &id, "out/result.csv", fetched.to_str().unwrap()]);
        assert_eq!(status, 0, "{err}");
        assert_eq!(std::fs::read(&fetched).unwrap(), expected);
        // exec with --file and --out-dir: the input is there, the output saved under DIR.
        let saved = dir.path().join("saved");
        let (status, out, err) = server.session_cli(&[
            "exec",
            &id,
            "--file",
            &format!("again.csv={}", csv.display()),
            "--out-dir",
            saved.to_str().unwrap(),
            "-c",
            "pd.read_csv('again.csv').to_csv('out/again.csv', index=False); print('done')",
        ]);
        assert_eq!((status, out.as_str()), (0, "done\n"), "{err}");
        assert_eq!(
            std::fs::read(saved.join("again.csv")).unwrap(),
            b"a,b\n1,2\n3,4\n"
        );
        assert!(
            err.contains("again.csv"),
            "the saved files are listed: {err}"
        );
        // A symlink is neither listed as a file nor downloaded through.
        server.request(
            "POST",
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "os.symlink('/etc/passwd', 'out/pw.txt')"})),
        );
        let (status, body) = server.curl(&[&format!(
            "http://codecage/v1/sessions/{id}/files/out/pw.txt"
        )]);
        assert_eq!(status, 400, "{body}");
        assert!(!body.contains("root:x:0"));
        // Bad names are refused.
        let (status, body) = server.curl(&[
            "-X",
            "PUT",
            "--data-binary",
            "x",
            &format!("http://codecage/v1/sessions/{id}/files/a%0Ab"),
        ]);
        assert_eq!(status, 400, "{body}");
        server.stop();
    });
}
