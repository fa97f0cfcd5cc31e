//! Property tests over everything that parses input codecage does not control: durations
//! and sizes, knob values, profiles, and the frames the sandbox sends. No input may panic,
//! and nothing accepted may be wrong (out of range, or not what was written). The same
//! harness takes the HTTP request types.

use proptest::prelude::*;

use crate::knobs::{Knob, Raw, KNOBS};
use crate::profile::Profile;
use crate::protocol::{write_message, FrameReader, FromSandbox, Phase, MAX_FRAME};
use crate::units::{format_duration, format_size, parse_duration, parse_size};

fn any_knob() -> impl Strategy<Value = Knob> {
    (0..KNOBS.len()).prop_map(|i| KNOBS[i].knob)
}

/// Strings that look like what people write for limits, and garbage.
fn value_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,25}(\\.[0-9]{0,6})?(ms|s|m|h|K|M|G|T|k|B|iB|MiB)?",
        "-?[0-9eE+.]{1,12}",
        ".{0,40}",
    ]
}

proptest! {
    #[test]
    fn durations_and_sizes_never_panic_and_accept_only_positive_values(text in value_text()) {
        if let Ok(d) = parse_duration(&text) {
            prop_assert!(!d.is_zero());
        }
        if let Ok(n) = parse_size(&text) {
            prop_assert!(n >= 1);
        }
    }

    #[test]
    fn formatted_sizes_and_durations_read_back(bytes in 1u64..(1 << 50), ms in 1u64..1_000_000_000_000) {
        prop_assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        let d = std::time::Duration::from_millis(ms);
        prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
    }

    #[test]
    fn an_accepted_knob_value_is_in_range_and_shows_as_itself(knob in any_knob(), text in value_text()) {
        if let Ok(value) = knob.parse(&text) {
            let def = knob.def();
            prop_assert!((def.min..=def.max).contains(&value), "{} {}", knob, value);
            prop_assert_eq!(knob.parse(&knob.show(value)), Ok(value));
        }
    }

    #[test]
    fn raw_numbers_from_documents_are_checked_like_text(knob in any_knob(), n in any::<i64>(), f in any::<f64>()) {
        for raw in [Raw::Int(n), Raw::Float(f)] {
            if let Ok(value) = knob.from_raw(&raw) {
                prop_assert!(knob.check(value).is_ok());
            }
        }
    }

    #[test]
    fn profiles_never_panic(text in ".{0,300}") {
        let _ = Profile::parse(&text, "fuzz.toml");
    }

    #[test]
    fn an_accepted_profile_holds_only_values_in_range_and_below_their_maxima(
        entries in proptest::collection::vec((any_knob(), any::<bool>(), value_text()), 0..8)
    ) {
        let mut sections: std::collections::BTreeMap<&str, String> = Default::default();
        for (knob, is_max, text) in &entries {
            let key = match (is_max, knob.max_key()) {
                (true, Some(max)) => max,
                _ => knob.key().to_string(),
            };
            let section = sections.entry(knob.def().section.name()).or_default();
            section.push_str(&format!("{key} = {}\n", toml::Value::String(text.clone())));
        }
        let text: String = sections.iter().map(|(s, body)| format!("[{s}]\n{body}")).collect();
        if let Ok(profile) = Profile::parse(&text, "fuzz.toml") {
            for knob in Knob::all() {
                prop_assert!(knob.check(profile.value(knob)).is_ok());
                prop_assert!(profile.value(knob) <= profile.max(knob));
            }
        }
    }

    #[test]
    fn frame_decoding_never_panics_and_stops_after_an_error(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        chunk in 1usize..64,
    ) {
        let mut reader = FrameReader::default();
        let mut errors = 0;
        for piece in bytes.chunks(chunk) {
            reader.feed(piece);
            while let Some(message) = reader.next_message() {
                if message.is_err() {
                    errors += 1;
                }
            }
        }
        prop_assert!(errors <= 1);
    }

    #[test]
    fn valid_frames_reassemble_whatever_the_reads(
        codes in proptest::collection::vec(any::<i32>(), 1..8),
        chunk in 1usize..32,
    ) {
        let mut wire = Vec::new();
        let sent: Vec<FromSandbox> = codes
            .iter()
            .map(|&c| FromSandbox::Exited { id: 1, code: Some(c), signal: None })
            .chain([FromSandbox::Mark { phase: Phase::SandboxBuilt, at_ns: 7 }])
            .collect();
        for message in &sent {
            write_message(&mut wire, message, MAX_FRAME).unwrap();
        }
        let mut reader = FrameReader::default();
        let mut got = Vec::new();
        for piece in wire.chunks(chunk) {
            reader.feed(piece);
            while let Some(message) = reader.next_message() {
                got.push(message.unwrap());
            }
        }
        prop_assert_eq!(got, sent);
    }

    #[test]
    fn an_accepted_file_path_stays_under_its_directory(
        path in prop_oneof![
            "[a-z./]{1,20}",
            "(\\.\\./|/|\\./|[a-z]{1,3}/){0,5}[a-z.]{0,4}",
            ".{0,30}",
        ],
    ) {
        if crate::files::check_input_path(&path).is_ok() {
            // Lexically under the directory: every component a plain name.
            prop_assert!(!path.starts_with('/'));
            for component in path.split('/') {
                prop_assert!(!component.is_empty() && component != "." && component != "..");
                prop_assert!(!component.chars().any(char::is_control));
            }
            // And written there, whatever it is: nothing appears beside the directory.
            let base = std::env::temp_dir().join(format!("codecage-prop-{}", std::process::id()));
            let dir = base.join("in");
            let file = crate::files::OutputFile {
                path: path.clone(),
                size: 1,
                media_type: String::new(),
                sha256: String::new(),
                data: Some(b"x".to_vec()),
            };
            let written = crate::files::save_under(&dir, &[file]);
            let beside: Vec<_> = std::fs::read_dir(&base).unwrap().flatten().map(|e| e.file_name()).collect();
            let _ = std::fs::remove_dir_all(&base);
            prop_assert_eq!(beside, vec![std::ffi::OsString::from("in")]);
            let written = written.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(written[0].starts_with(&dir));
        }
    }
}
