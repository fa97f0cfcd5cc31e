//! Profiles and language runners through the CLI: the code file, module kinds, policy.

use super::common::*;

#[test]
fn python_tracebacks_name_the_file_and_line() {
    as_root(|| {
        let run = run_json(&["--lang", "python", "-c", "x = 1\ny = 0\nprint(x / y)\n"]);
        assert_eq!(run.exit_code(), Some(1));
        assert!(
            run.stderr_field()
                .contains("File \"/work/main.py\", line 3"),
            "{}",
            run.json
        );
        assert!(
            run.stderr_field().contains("ZeroDivisionError"),
            "{}",
            run.json
        );
    });
}

#[test]
fn node_runs_commonjs_and_es_modules() {
    as_root(|| {
        let cjs = run_json(&[
            "--lang",
            "node",
            "-c",
            "const os = require('os'); console.log(typeof module.exports)",
        ]);
        assert_eq!(cjs.stdout(), "object\n", "{}", cjs.json);
        let esm = run_json(&[
            "--lang",
            "node",
            "-c",
            "import { hostname } from 'node:os';\nconsole.log(hostname(), typeof module)",
        ]);
        assert_eq!(esm.stdout(), "sandbox undefined\n", "{}", esm.json);
    });
}

#[test]
fn the_python_profile_sets_its_environment() {
    as_root(|| {
        let run = run_json(&[
            "--lang",
            "python",
            "-c",
            "import os; print(os.environ['MPLBACKEND'], os.environ['PYTHONUNBUFFERED'])",
        ]);
        assert_eq!(run.stdout(), "Agg 1\n", "{}", run.json);
    });
}

#[test]
fn a_request_above_the_profile_is_refused_with_policy() {
    for (flag, value, max) in [
        ("--timeout", "10m", "120s"),
        ("--memory", "4G", "2G"),
        ("--cpus", "8", "2"),
        ("--pids", "10000", "512"),
        ("--output-limit", "100M", "10M"),
        ("--tmp-size", "1G", "64M"),
    ] {
        let run = run_json(&[flag, value, "--", "true"]);
        assert_eq!(run.error(), Some("policy"), "{flag} {value}: {}", run.json);
        let message = run.json["message"].as_str().unwrap();
        assert!(
            message.contains(flag) && message.contains(max) && message.contains("bash"),
            "{message}"
        );
        assert_eq!(run.status, 125);
    }
    let run = run_json(&["--env", "LD_PRELOAD=/tmp/x.so", "--", "true"]);
    assert_eq!(run.error(), Some("policy"), "{}", run.json);
}

#[test]
fn a_request_up_to_the_profile_maximum_or_below_the_default_runs() {
    as_root(|| {
        let run = run_json(&["--timeout", "120s", "--memory", "64M", "--", "true"]);
        assert_eq!(run.error(), None, "{}", run.json);
    });
}

#[test]
fn a_profile_file_can_be_given_and_bad_ones_are_explained() {
    let dir = TempDir::new("profile");
    let good = dir.path().join("tight.toml");
    std::fs::write(&good, "language = \"bash\"\nrootfs = \"host\"\n[limits]\ntimeout = \"5s\"\nmax_timeout = \"5s\"\n").unwrap();
    let run = run_with_profile(good.to_str().unwrap(), &["--timeout", "6s", "-c", "true"]);
    assert_eq!(run.error(), Some("policy"), "{}", run.json);
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[limits]\nmemroy = \"1G\"\n").unwrap();
    let run = run_with_profile(bad.to_str().unwrap(), &["--", "true"]);
    assert_eq!(run.error(), Some("invalid_request"), "{}", run.json);
    let message = run.json["message"].as_str().unwrap();
    assert!(
        message.contains("bad.toml") && message.contains("memroy"),
        "{message}"
    );
    let run = run_with_profile("cobol", &["--", "true"]);
    assert!(
        run.json["message"].as_str().unwrap().contains("python"),
        "{}",
        run.json
    );
}

/// `codecage run --json --profile PROFILE ARGS...`, the rootfs the profile's own.
fn run_with_profile(profile: &str, args: &[&str]) -> Run {
    let mut cmd = codecage();
    cmd.args(["run", "--json", "--profile", profile]).args(args);
    parse(cmd.launch_output())
}

#[test]
fn profiles_lists_every_profile_with_its_values() {
    let out = codecage().args(["profiles", "--json"]).launch_output();
    assert_eq!(out.status.code(), Some(0));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for name in ["python", "node", "typescript", "bash"] {
        assert_eq!(all[name]["language"], name, "{all}");
        assert_eq!(all[name]["limits"]["memory"], "256M");
        assert_eq!(all[name]["limits"]["timeout"], "30s");
    }
}

#[test]
fn without_a_built_image_the_message_says_how_to_build_one() {
    let out = codecage()
        .env("CODECAGE_DATA_DIR", "/nonexistent/codecage-data")
        .args(["run", "--json", "--lang", "python", "-c", "print(1)"])
        .launch_output();
    let run = parse(out);
    let message = run.json["message"].as_str().unwrap();
    assert!(
        message.contains("cargo xtask rootfs") && message.contains("--rootfs host"),
        "{message}"
    );
    assert_eq!(run.status, 125);
}
