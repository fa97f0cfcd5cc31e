//! The built image (`cargo xtask rootfs`): the languages and libraries agents ask for, and
//! no setuid file; and `codecage image build|list|verify` (`commands`, at the end). CI
//! builds the image before the tests; the VM lane skips this module.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::common::*;

/// The default image's directory, or why there is none.
pub(super) fn image() -> Result<PathBuf, String> {
    let data = std::env::var_os("CODECAGE_DATA_DIR")
        .map_or_else(|| PathBuf::from("/var/lib/codecage"), PathBuf::from);
    std::fs::canonicalize(data.join("rootfs/default")).map_err(|e| {
        format!("the default image, which is not built ({e}): run `cargo xtask rootfs` first")
    })
}

/// Runs a test of the default image, as root: it runs sandboxes from the image, or reads
/// all of it. These tests prove the image, and a missing one proves nothing: it is
/// [`unavailable`].
pub(super) fn image_test(test: impl FnOnce(&Path)) {
    as_root(|| match image() {
        Ok(dir) => test(&dir),
        Err(why) => unavailable(&why),
    });
}

pub(super) fn in_image(args: &[&str]) -> Run {
    let mut all = vec!["--rootfs", "default"];
    all.extend(args);
    run_json(&all)
}

#[test]
fn python_has_numpy_pandas_matplotlib_and_requests() {
    image_test(|_| {
        let code = "import sys, numpy, pandas, matplotlib, requests\n\
                    print(sys.version_info[:2] >= (3, 9), numpy.__version__ > '1', pandas.DataFrame({'a': [1, 2]}).a.sum())\n\
                    print(matplotlib.get_backend().lower())";
        let run = in_image(&["--lang", "python", "-c", code]);
        assert_eq!(run.stdout(), "True True 3\nagg\n", "{}", run.json);
    });
}

#[test]
fn matplotlib_saves_a_png_into_the_working_directory() {
    image_test(|_| {
        let code = "import matplotlib.pyplot as plt\n\
                    plt.plot([1, 2, 3], [3, 1, 2]); plt.title('codecage'); plt.savefig('plot.png')\n\
                    data = open('/work/plot.png', 'rb').read()\n\
                    print(data[:8] == b'\\x89PNG\\r\\n\\x1a\\n', len(data) > 1000)";
        let run = in_image(&["--lang", "python", "--timeout", &secs(60), "-c", code]);
        assert_eq!(run.stdout(), "True True\n", "{}", run.json);
    });
}

#[test]
fn node_prints_its_version() {
    image_test(|_| {
        let run = in_image(&[
            "--lang",
            "node",
            "-c",
            "console.log(process.version.startsWith('v'))",
        ]);
        assert_eq!(run.stdout(), "true\n", "{}", run.json);
    });
}

#[test]
fn a_typescript_file_with_types_runs() {
    image_test(|_| {
        let dir = TempDir::new("ts");
        let file = dir.path().join("typed.ts");
        std::fs::write(
            &file,
            "interface Point { x: number; y: number }\n\
             const norm = (p: Point): number => Math.hypot(p.x, p.y);\n\
             const p: Point = { x: 3, y: 4 };\n\
             console.log(`norm ${norm(p)}`);\n",
        )
        .unwrap();
        let run = in_image(&["--timeout", &secs(60), file.to_str().unwrap()]);
        assert_eq!(run.stdout(), "norm 5\n", "{}", run.json);
    });
}

#[test]
fn bash_runs_a_pipeline_of_the_usual_tools() {
    image_test(|_| {
        let script = "printf 'b 2\\na 1\\nc 3\\n' | sort | awk '{s += $2; print $1} END {print s}' | sed 's/a/A/' | grep -v c | tr '\\n' ' '; \
                      find /usr/bin -maxdepth 1 -name 'gawk' | wc -l";
        let run = in_image(&["--lang", "bash", "-c", script]);
        assert_eq!(run.stdout(), "A b 6 1\n", "{}", run.json);
    });
}

#[test]
fn the_image_has_no_setuid_or_setgid_file_and_a_manifest() {
    image_test(|dir| {
        let mut found = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap().flatten() {
                let meta = entry.path().symlink_metadata().unwrap();
                if meta.is_dir() {
                    stack.push(entry.path());
                } else if meta.permissions().mode() & 0o6000 != 0 {
                    found.push(entry.path());
                }
            }
        }
        assert!(
            found.is_empty(),
            "setuid/setgid files in the image: {found:?}"
        );
        let manifest: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("usr/share/codecage/manifest.json")).unwrap(),
        )
        .unwrap();
        assert!(manifest.to_string().contains("numpy"), "{manifest}");
    });
}

/// A session on the default image: the driver renders figures and rich values inside the
/// sandbox.
fn image_session(lang: codecage::runner::Lang, dir: &Path) -> codecage::session::Session {
    in_process_launcher();
    let mut sandbox = codecage::SandboxSpec {
        rootfs: codecage::Rootfs::Dir(dir.to_path_buf()),
        init_exe: env!("CARGO_BIN_EXE_codecage").into(),
        ..Default::default()
    };
    if let Some(limits) = sandbox.limits.as_mut() {
        limits.memory = 1 << 30;
    }
    let spec = codecage::session::SessionSpec {
        sandbox,
        lang,
        context_exec: Vec::new(),
        env: vec![
            ("MPLBACKEND".into(), "Agg".into()),
            ("OPENBLAS_NUM_THREADS".into(), "1".into()),
        ],
        timeout: std::time::Duration::from_secs(60),
        output_limit: 1 << 20,
        outputs: None,
    };
    codecage::session::Session::start(spec).unwrap_or_else(|e| panic!("no session: {e}"))
}

fn session_call(session: &mut codecage::session::Session, code: &str) -> serde_json::Value {
    let call = codecage::session::Call {
        code: code.into(),
        ..Default::default()
    };
    serde_json::to_value(session.execute(&call, &mut |_| {})).unwrap()
}

#[test]
fn a_session_plot_comes_back_as_a_png_display() {
    image_test(|dir| {
        use base64::Engine as _;
        let mut s = image_session(codecage::runner::Lang::Python, dir);
        let out = session_call(
            &mut s,
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('codecage')",
        );
        assert_eq!(out["error"], serde_json::Value::Null, "{out}");
        let displays = out["displays"].as_array().unwrap();
        assert_eq!(displays.len(), 1, "{out}");
        let png = base64::engine::general_purpose::STANDARD
            .decode(displays[0]["image/png"].as_str().unwrap())
            .unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let (width, height) = (
            u32::from_be_bytes(png[16..20].try_into().unwrap()),
            u32::from_be_bytes(png[20..24].try_into().unwrap()),
        );
        assert!(
            width <= 1600 && height <= 1600 && width > 100,
            "{width}x{height}"
        );
        // plt.show() hands the figure over at once; nothing is left open after.
        let out = session_call(&mut s, "plt.plot([1]); plt.show(); len(plt.get_fignums())");
        assert_eq!(out["displays"].as_array().unwrap().len(), 1, "{out}");
        assert_eq!(out["result"]["text/plain"], "0", "{out}");
        s.close().unwrap();
    });
}

#[test]
fn a_session_dataframe_of_100000_rows_comes_back_bounded() {
    image_test(|dir| {
        let mut s = image_session(codecage::runner::Lang::Python, dir);
        let out = session_call(
            &mut s,
            "import pandas as pd\ndf = pd.DataFrame({'a': range(100000), 'b': [0.5] * 100000})\ndf",
        );
        let plain = out["result"]["text/plain"].as_str().unwrap();
        let html = out["result"]["text/html"].as_str().unwrap();
        assert!(
            plain.contains("100000 rows") && plain.contains("dtypes"),
            "{plain}"
        );
        assert!(
            plain.len() < 8000 && html.len() < 64 * 1024,
            "{} {}",
            plain.len(),
            html.len()
        );
        assert!(
            !plain.contains("50000"),
            "the middle of the frame leaked: {plain}"
        );
        s.close().unwrap();
    });
}

#[test]
fn a_typescript_session_strips_types_and_keeps_state() {
    image_test(|dir| {
        let mut s = image_session(codecage::runner::Lang::Typescript, dir);
        let out = session_call(&mut s, "interface P { x: number }\nconst p: P = { x: 41 };");
        assert_eq!(out["error"], serde_json::Value::Null, "{out}");
        let out = session_call(&mut s, "const f = (q: P): number => q.x + 1;\nf(p)");
        assert_eq!(out["result"]["text/plain"], "42", "{out}");
        s.close().unwrap();
    });
}

#[test]
fn a_typescript_session_prints_with_console_log() {
    image_test(|image| {
        let mut s = super::sessions::session_on(
            codecage::runner::Lang::Typescript,
            codecage::Rootfs::Dir(image.to_path_buf()),
            None,
        );
        let out = super::sessions::call(&mut s, "const n: number = 2; console.log(`n=${n}`)");
        assert_eq!(out["stdout"], "n=2\n", "{out}");
        s.close().unwrap();
    });
}

/// An image's root is an overlay of it whose layers are named by sandbox paths: the mount
/// table a sandbox reads does not give the image's directory on the host (a bind of it
/// did: its path in the host's file system is a bind's root).
#[test]
fn the_mount_table_does_not_name_the_image_s_host_directory() {
    image_test(|dir| {
        let run = in_image(&[
            "--",
            "cat",
            "/proc/self/mountinfo",
            "/proc/self/mounts",
            "/proc/self/mountstats",
        ]);
        let out = run.stdout();
        let dir = dir.to_str().unwrap();
        assert!(!out.contains(dir), "{dir} in:\n{out}");
        assert!(!out.contains("/var/lib/codecage"), "{out}");
        let root = out
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some("/"))
            .unwrap_or_else(|| panic!("no root in:\n{out}"));
        assert!(
            root.contains(" / / ") && root.contains(" - overlay overlay "),
            "{root}"
        );
    });
}

/// `codecage image build|list|verify`: the installed default image, and a tiny image of a
/// test recipe made with the image crate's own manifest code (step 7 of a build and its
/// install, without the minutes of mmdebstrap, pip and npm before it).
#[cfg(feature = "image")]
mod commands {
    use std::path::{Path, PathBuf};
    use std::process::Output;
    use std::time::{Duration, Instant};

    use codecage_image::rootfs::{build::BuildInfo, manifest, Recipe};

    use super::super::common::*;
    use super::image_test;

    fn image_cmd(args: &[&str]) -> Output {
        codecage().arg("image").args(args).output().unwrap()
    }

    fn stderr(out: &Output) -> String {
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// `<dir>/recipes/tiny/` and, in `<dir>/out`, its image as a build leaves it:
    /// `tiny-<H12>/` with the manifest inside and beside it, and the link `tiny`.
    struct Tiny {
        dir: TempDir,
        image: PathBuf,
    }

    impl Tiny {
        fn new() -> Tiny {
            let dir = TempDir::new("image-tiny");
            let recipes = dir.path().join("recipes");
            std::fs::create_dir_all(recipes.join("tiny")).unwrap();
            std::fs::write(recipes.join("tiny/packages.txt"), "bash\n").unwrap();
            let recipe = Recipe::find(&[recipes], "tiny").unwrap();
            let out = dir.path().join("out");
            let name = format!("tiny-{}", recipe.short());
            let image = out.join(&name);
            for (rel, content) in [
                ("etc/hostname", "sandbox\n"),
                ("usr/bin/hello", "#!/bin/sh\necho hello\n"),
                (
                    "var/lib/dpkg/status",
                    "Package: bash\nStatus: install ok installed\nArchitecture: amd64\nVersion: 5.2.15-2+b7\n\n",
                ),
            ] {
                let path = image.join(rel);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, content).unwrap();
            }
            let m =
                manifest::build(&image, &recipe, &BuildInfo::default(), Instant::now()).unwrap();
            let text = serde_json::to_string_pretty(&m.json).unwrap() + "\n";
            manifest::write_into_image(&image, &text).unwrap();
            std::fs::write(out.join(format!("{name}.manifest.json")), text).unwrap();
            std::os::unix::fs::symlink(&name, out.join("tiny")).unwrap();
            Tiny { dir, image }
        }

        fn recipes(&self) -> PathBuf {
            self.dir.path().join("recipes")
        }

        fn out(&self) -> PathBuf {
            self.dir.path().join("out")
        }

        fn arg(path: &Path) -> &str {
            path.to_str().unwrap()
        }
    }

    #[test]
    fn list_shows_the_installed_default_image_as_current() {
        image_test(|dir| {
            let out = image_cmd(&["list", "--json"]);
            assert!(out.status.success(), "{}", stderr(&out));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let images = v["images"].as_array().unwrap();
            let current = images
                .iter()
                .find(|i| i["recipe"] == "default" && i["current"] == true)
                .unwrap_or_else(|| panic!("no current default image in {v}"));
            assert_eq!(Path::new(current["path"].as_str().unwrap()), dir, "{v}");
            let name = dir.file_name().unwrap().to_str().unwrap();
            assert_eq!(current["image"], name, "{v}");
            assert!(name.ends_with(current["short_hash"].as_str().unwrap()));
            assert_eq!(current["hash"].as_str().unwrap().len(), 64, "{v}");
            assert!(current["size_bytes"].as_u64().unwrap() > 100 << 20, "{v}");
            assert!(current["built_at"].as_str().unwrap().ends_with('Z'), "{v}");
            // The table marks it too.
            let out = image_cmd(&["list"]);
            let table = String::from_utf8_lossy(&out.stdout);
            let hash = current["short_hash"].as_str().unwrap();
            assert!(
                table.lines().any(|l| l.starts_with("* default ")
                    && l.contains(&format!(" {hash} "))
                    && l.ends_with(&dir.display().to_string())),
                "{table}"
            );
        });
    }

    #[test]
    fn verify_passes_on_the_installed_default_image() {
        image_test(|dir| {
            let out = image_cmd(&["verify"]);
            let err = stderr(&out);
            assert!(out.status.success(), "{err}");
            let name = dir.file_name().unwrap().to_str().unwrap();
            assert!(err.contains(&format!("Verified {name} (")), "{err}");
        });
    }

    #[test]
    fn verify_names_the_file_changed_in_an_image() {
        let tiny = Tiny::new();
        let out_dir = tiny.out();
        let verify = || image_cmd(&["verify", "tiny", "--out", Tiny::arg(&out_dir)]);
        let ok = verify();
        assert!(ok.status.success(), "{}", stderr(&ok));
        assert!(stderr(&ok).contains("Verified tiny-"), "{}", stderr(&ok));

        // Past the file system's timestamp granularity (a jiffy).
        std::thread::sleep(Duration::from_millis(50));
        std::fs::write(
            tiny.image.join("usr/bin/hello"),
            "#!/bin/sh\necho changed\n",
        )
        .unwrap();
        let bad = verify();
        let err = stderr(&bad);
        assert_eq!(bad.status.code(), Some(1), "{err}");
        assert!(err.contains("does not match its manifest"), "{err}");
        assert!(err.contains("\n  /usr/bin/hello"), "{err}");
        assert!(!err.contains("/etc/hostname"), "{err}");
    }

    #[test]
    fn build_of_an_up_to_date_recipe_builds_nothing() {
        let tiny = Tiny::new();
        let (recipes, out_dir) = (tiny.recipes(), tiny.out());
        let before: Vec<_> = std::fs::read_dir(&out_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        let start = Instant::now();
        let out = image_cmd(&[
            "build",
            "tiny",
            "--recipes",
            Tiny::arg(&recipes),
            "--out",
            Tiny::arg(&out_dir),
        ]);
        let took = start.elapsed();
        let err = stderr(&out);
        assert!(out.status.success(), "{err}");
        assert!(err.contains("is up to date"), "{err}");
        assert!(!err.contains("Building"), "{err}");
        assert!(took < Duration::from_secs(5), "{took:?}: {err}");
        let after: Vec<_> = std::fs::read_dir(&out_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(before.len(), after.len(), "{before:?} -> {after:?}");

        let list = image_cmd(&["list", "--out", Tiny::arg(&out_dir), "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
        assert_eq!(v["images"][0]["recipe"], "tiny", "{v}");
        assert_eq!(v["images"][0]["current"], true, "{v}");
        assert_eq!(
            Path::new(v["images"][0]["path"].as_str().unwrap()),
            tiny.image,
            "{v}"
        );
    }

    #[test]
    fn an_unknown_recipe_names_the_directories_searched() {
        let tiny = Tiny::new();
        let recipes = tiny.recipes();
        let out = image_cmd(&[
            "build",
            "no-such-recipe",
            "--recipes",
            Tiny::arg(&recipes),
            "--out",
            Tiny::arg(&tiny.out()),
        ]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("unknown rootfs recipe \"no-such-recipe\""),
            "{err}"
        );
        assert!(
            err.contains(&format!("{}: tiny", recipes.display())),
            "{err}"
        );
        for dir in ["/etc/codecage/recipes", "/usr/share/codecage/recipes"] {
            assert!(err.contains(&format!("\n  {dir}: ")), "{err}");
        }
        // The checkout's recipes (the test binary runs from this one's target/).
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("rootfs");
        assert!(
            err.contains(&format!("{}: default", checkout.display())),
            "{err}"
        );
    }
}
