//! The exec policy (`[exec]` of a profile): with `security = "allowlist"` the kernel
//! refuses to execute anything but the allowed programs, whatever the shell does; with
//! `full` (the default) nothing changes. Runs on the host rootfs.

use std::time::Duration;

use codecage::runner::Lang;
use codecage::session::{Session, SessionSpec};
use codecage::{Rootfs, SandboxSpec};

use super::common::*;

/// A profile file with `[exec]` `body`, in `dir`.
fn profile(dir: &TempDir, body: &str) -> String {
    let path = dir.path().join("exec.toml");
    std::fs::write(&path, format!("language = \"bash\"\n[exec]\n{body}\n")).unwrap();
    path.to_string_lossy().into_owned()
}

/// Every way of running a program the allowlist leaves out, each line `NAME STATUS`, with
/// the error bash or the loader printed in stderr.
const BYPASSES: &str = r#"
ld=$(ls /lib64/ld-linux-*.so.* /lib/ld-linux-*.so.* 2>/dev/null | head -n 1)
libc=$(ls /lib/*-linux-gnu/libc.so.6 /usr/lib/*-linux-gnu/libc.so.6 2>/dev/null | head -n 1)
ls / | grep -x usr; echo "pipeline $?"
rm -f f; echo "rm $?"
bash -c "$(echo rm) f"; echo "substitution $?"
for dir in /work /tmp /dev/shm; do
  cp /usr/bin/rm $dir/rm && chmod +x $dir/rm && $dir/rm f; echo "copy-in-$dir $?"
done
printf '#!/usr/bin/python3\nprint(1)\n' > /work/s.py; chmod +x /work/s.py; /work/s.py; echo "shebang $?"
bash -c /work/s.py; echo "shebang-from-bash $?"
$ld /usr/bin/rm f; echo "loader $?"
$ld /work/rm f; echo "loader-copy $?"
cp $ld /work/ld && chmod +x /work/ld && /work/ld /usr/bin/rm f; echo "loader-copied $?"
$libc; echo "library $?"
python3 -c 'print(1)'; echo "python $?"
(rm f; echo "background $?" > /work/bg) & wait; cat /work/bg
$ld /usr/bin/ls -d /work; echo "loader-allowed $?"
"#;

#[test]
fn an_allowlist_lets_only_its_programs_run_whatever_the_shell_does() {
    as_root(|| {
        let dir = TempDir::new("exec-allowlist");
        let profile = profile(
            &dir,
            r#"security = "allowlist"
allowed = ["bash", "ls", "cat", "grep", "cp", "chmod", "head"]"#,
        );
        let run = bash(&["--profile", &profile], BYPASSES);
        assert_eq!(run.error(), None, "{}", run.json);
        let out = run.stdout();
        let status = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no line for {name}: {}", run.json))
                .to_string()
        };
        assert!(out.starts_with("usr\npipeline 0\n"), "{}", run.json);
        // EACCES at execve: bash says "Permission denied" and exits 126.
        for name in [
            "rm",
            "substitution",
            "copy-in-/work",
            "copy-in-/tmp",
            "copy-in-/dev/shm",
            "shebang",
            "shebang-from-bash",
            "loader-copied",
            "library",
            "python",
            "background",
        ] {
            assert_eq!(status(name), "126", "{name}: {}", run.json);
        }
        // The loader runs (it must, for every allowed program), but cannot map the
        // program: EPERM from mmap(PROT_EXEC) on a noexec mount.
        assert_eq!(status("loader"), "127", "{}", run.json);
        assert_eq!(status("loader-copy"), "127", "{}", run.json);
        assert_eq!(status("loader-allowed"), "0", "{}", run.json);
        let stderr = run.stderr_field();
        assert!(
            stderr.contains("/usr/bin/rm: Permission denied")
                && stderr.contains("/work/rm: Permission denied")
                && stderr.contains("/work/s.py: Permission denied")
                && stderr.contains("python3: Permission denied")
                && stderr.contains("failed to map segment from shared object"),
            "{}",
            run.json
        );
    });
}

#[test]
fn a_denied_entry_wins_over_allowed() {
    as_root(|| {
        let dir = TempDir::new("exec-denied");
        let profile = profile(
            &dir,
            r#"security = "allowlist"
allowed = ["bash", "ls", "cat"]
denied = ["/usr/bin/cat"]"#,
        );
        let run = bash(
            &["--profile", &profile],
            "ls -d /work; echo \"ls $?\"; cat /etc/hostname; echo \"cat $?\"",
        );
        assert_eq!(run.stdout(), "/work\nls 0\ncat 126\n", "{}", run.json);
        assert!(
            run.stderr_field().contains("cat: Permission denied"),
            "{}",
            run.json
        );
    });
}

#[test]
fn an_unknown_name_in_allowed_is_a_profile_error_naming_it() {
    as_root(|| {
        let dir = TempDir::new("exec-unknown");
        let profile = profile(
            &dir,
            r#"security = "allowlist"
allowed = ["bash", "no-such-program-xyz"]"#,
        );
        let out = codecage_run()
            .args(["--profile", &profile, "--", "bash", "-c", "true"])
            .launch_output();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0));
        assert!(
            stderr.contains("no-such-program-xyz") && stderr.contains("PATH"),
            "{stderr}"
        );
        // The language's interpreter must be allowed too.
        let profile2 = dir.path().join("py.toml");
        std::fs::write(
            &profile2,
            "language = \"python\"\n[exec]\nsecurity = \"allowlist\"\nallowed = [\"ls\"]\n",
        )
        .unwrap();
        let out = codecage_run()
            .arg("--profile")
            .arg(&profile2)
            .args(["--lang", "python", "-c", "print(1)"])
            .launch_output();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("python3") && stderr.contains("exec.allowed"),
            "{stderr}"
        );
    });
}

#[test]
fn full_is_unchanged() {
    as_root(|| {
        let dir = TempDir::new("exec-full");
        let profile = profile(&dir, r#"security = "full""#);
        let script =
            "ld=$(ls /lib64/ld-linux-*.so.* /lib/ld-linux-*.so.* 2>/dev/null | head -n 1)\n\
                      touch f; $ld /usr/bin/rm f; echo \"loader $?\"\n\
                      cp /usr/bin/true /work/t && /work/t; echo \"copy $?\"";
        for flags in [vec!["--profile", profile.as_str()], vec![]] {
            let run = bash(&flags, script);
            assert_eq!(run.stdout(), "loader 0\ncopy 0\n", "{}", run.json);
        }
    });
}

#[test]
fn a_bash_session_under_an_allowlist_runs_only_its_programs() {
    as_root(|| {
        in_process_launcher();
        let section = codecage::exec_policy::ExecSection {
            security: codecage::exec_policy::ExecSecurity::Allowlist,
            allowed: vec!["bash".into(), "ls".into(), "grep".into()],
            ..Default::default()
        };
        let allowlist = codecage::exec_policy::resolve(
            &section,
            std::path::Path::new("/"),
            codecage::spec::SANDBOX_PATH,
        )
        .unwrap();
        let sandbox = SandboxSpec {
            rootfs: Rootfs::Host,
            init_exe: env!("CARGO_BIN_EXE_codecage").into(),
            exec: Some(allowlist),
            ..Default::default()
        };
        let mut session = Session::start(SessionSpec {
            sandbox,
            lang: Lang::Bash,
            context_exec: Vec::new(),
            env: Vec::new(),
            timeout: Duration::from_secs(30 * slowdown()),
            output_limit: 1 << 20,
            outputs: None,
        })
        .unwrap_or_else(|e| panic!("the session did not start: {e}"));
        let result =
            super::sessions::call(&mut session, "ls / | grep -x usr; rm -f x; echo \"rm $?\"");
        assert_eq!(result["stdout"], "usr\nrm 126\n", "{result}");
        session.close().unwrap();
    });
}

/// A memfd lives on the kernel's internal shmem mount, which is not noexec and which
/// landlock lets through: under an allowlist it cannot be made (seccomp), so a program
/// cannot be copied into one and executed from there. Without one it can.
#[test]
fn under_an_allowlist_memfd_create_is_refused() {
    as_root(|| {
        let dir = TempDir::new("exec-memfd");
        let path = dir.path().join("py.toml");
        std::fs::write(
            &path,
            "language = \"python\"\n[exec]\nsecurity = \"allowlist\"\nallowed = [\"python3\"]\n",
        )
        .unwrap();
        let code = "import os, errno\n\
                    try:\n\
                    \x20   os.memfd_create('x'); print('OK')\n\
                    except OSError as e:\n\
                    \x20   print(errno.errorcode[e.errno])";
        let path = path.to_string_lossy();
        let run = run_json(&["--profile", &path, "--lang", "python", "-c", code]);
        assert_eq!(run.stdout(), "EPERM\n", "{}", run.json);
        let run = run_json(&["--lang", "python", "-c", code]);
        assert_eq!(run.stdout(), "OK\n", "{}", run.json);
    });
}
