//! What the default profiles do on the kernel at hand: they run wherever landlock exists,
//! and the result says what this kernel's landlock lacks and what covers it. The same
//! tests run natively and in each VM lane (older kernels, pure v1 cgroups).

use super::common::*;

#[test]
fn the_default_profile_runs_and_lists_what_this_kernels_landlock_lacks() {
    as_root(|| {
        let Some(abi) = kernel_landlock_abi() else {
            // No landlock at all: the default refuses, and says why and what to do.
            let run = run_json(&["--", "true"]);
            assert_eq!(run.error(), Some("setup"), "{}", run.json);
            let message = run.json["message"].as_str().unwrap();
            assert!(
                message.contains("landlock is required") && message.contains("best-effort"),
                "{message}"
            );
            return;
        };
        let run = run_json(&["--lang", "python", "-c", "print('ran')"]);
        assert_eq!(run.error(), None, "{}", run.json);
        assert_eq!(run.stdout(), "ran\n");
        assert_eq!(
            run.json["landlock_abi"].as_u64(),
            Some(u64::from(abi)),
            "{}",
            run.json
        );
        let skipped = run.json["skipped_layers"].as_array().unwrap();
        let lacking = (abi + 1..=6).count();
        assert_eq!(skipped.len(), lacking, "{}", run.json);
        for entry in skipped {
            assert_eq!(entry["layer"], "landlock", "{entry}");
            assert!(
                entry["reason"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("ABI {abi}")),
                "{entry}"
            );
            assert!(
                entry["covered_by"].as_str().is_some_and(|c| !c.is_empty()),
                "{entry}"
            );
        }
    });
}

#[test]
fn a_strict_profile_refuses_below_abi_6_and_runs_from_it() {
    as_root(|| {
        let dir = TempDir::new("strict");
        let profile = dir.path().join("strict.toml");
        std::fs::write(
            &profile,
            "language = \"bash\"\n[hardening]\nlandlock = \"strict\"\n",
        )
        .unwrap();
        let run = run_json(&["--profile", profile.to_str().unwrap(), "--", "true"]);
        match kernel_landlock_abi() {
            Some(abi) if abi >= 6 => {
                assert_eq!(run.error(), None, "{}", run.json);
                assert_eq!(run.json["skipped_layers"], serde_json::json!([]));
            }
            _ => {
                assert_eq!(run.error(), Some("setup"), "{}", run.json);
                assert!(
                    run.json["message"].as_str().unwrap().contains("strict"),
                    "{}",
                    run.json
                );
            }
        }
    });
}

/// What a profile turns off is listed as such, layer by layer.
#[test]
fn layers_turned_off_are_listed_as_structured_entries() {
    as_root(|| {
        let dir = TempDir::new("off");
        let profile = dir.path().join("off.toml");
        std::fs::write(
            &profile,
            "language = \"bash\"\n[hardening]\nseccomp = \"off\"\nlandlock = \"off\"\n",
        )
        .unwrap();
        let run = run_json(&["--profile", profile.to_str().unwrap(), "--", "true"]);
        assert_eq!(run.error(), None, "{}", run.json);
        let layers: Vec<(&str, &str)> = run.json["skipped_layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["layer"].as_str().unwrap(), e["reason"].as_str().unwrap()))
            .collect();
        assert_eq!(
            layers,
            [
                ("landlock", "turned off by the profile"),
                ("seccomp", "turned off by the profile")
            ],
            "{}",
            run.json
        );
    });
}
