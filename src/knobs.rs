//! Every numeric setting of a sandbox, declared once: its name, unit, default, default
//! maximum, the range the kernel (or sense) allows, and how far a request may move it.
//! Profiles, requests (CLI flags, API fields), `Spec` defaults, validation and the docs'
//! tables are all derived from [`KNOBS`]; adding a setting touches this table, the code that
//! applies it ([`crate::spec::Spec::set`]) and a test.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::{format_duration, format_size, parse_duration, parse_size};

/// One setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Knob {
    Timeout,
    Memory,
    Cpus,
    Pids,
    OutputLimit,
    Nofile,
    TmpSize,
    WorkSize,
    OutputFileSize,
    OutputTotalSize,
    OutputFiles,
    InputFiles,
    InputTotalSize,
    IdleTimeout,
    MaxDuration,
    ProcessBuffer,
    MaxBandwidth,
    MaxConnections,
    ConnectionIdleTimeout,
}

/// How values of a knob are written, and the base unit it is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Milliseconds; written as seconds or with a unit (`30`, `30s`, `500ms`, `2m`).
    Duration,
    /// Bytes; written as bytes or with a binary suffix (`268435456`, `256M`, `1G`).
    Size,
    /// A whole number.
    Count,
    /// Thousandths of a CPU; written as a decimal number of CPUs (`0.5`, `2`).
    Cpus,
}

/// Which profile table a knob lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    Limits,
    Filesystem,
    Inputs,
    Outputs,
    Session,
    Network,
}

impl Section {
    pub fn name(self) -> &'static str {
        match self {
            Section::Limits => "limits",
            Section::Filesystem => "filesystem",
            Section::Inputs => "inputs",
            Section::Outputs => "outputs",
            Section::Session => "session",
            Section::Network => "network",
        }
    }
}

/// How far a request may move a knob from its profile's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headroom {
    /// Up to the profile's `max_<key>` (which has its own default).
    UpToMax(u64),
    /// Only lower than the profile's value (sizes the sandbox is built with).
    LowerOnly,
    /// Not at all: only a profile sets it.
    ProfileOnly,
}

/// The declaration of one knob.
#[derive(Debug)]
pub struct Definition {
    pub knob: Knob,
    /// The profile key, the API field and (with `-` for `_`) the CLI flag.
    pub key: &'static str,
    pub section: Section,
    pub unit: Unit,
    /// In the unit's base (ms, bytes, count, milli-CPUs).
    pub default: u64,
    pub headroom: Headroom,
    /// Every value outside this is refused, wherever it comes from.
    pub min: u64,
    pub max: u64,
    /// Why the range is what it is, for the error message.
    pub range_reason: &'static str,
    /// One line for `--help` and the docs.
    pub help: &'static str,
}

const MS: u64 = 1;
const SEC: u64 = 1000 * MS;
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The smallest memory limit a sandbox can start with: its init and the payload's
/// interpreter must fit.
pub const MIN_MEMORY: u64 = 8 * MIB;
/// The largest pids.max the kernel accepts (PID_MAX_LIMIT on 64-bit).
pub const MAX_PIDS: u64 = 4_194_304;

/// Every knob, in the order docs and `--help` list them.
pub const KNOBS: &[Definition] = &[
    Definition {
        knob: Knob::Timeout,
        key: "timeout",
        section: Section::Limits,
        unit: Unit::Duration,
        default: 30 * SEC,
        headroom: Headroom::UpToMax(120 * SEC),
        min: MS,
        max: 24 * 3600 * SEC,
        range_reason: "from 1ms to 24h",
        help: "Wall-clock limit; the whole process tree is killed (30, 30s, 500ms, 2m)",
    },
    Definition {
        knob: Knob::Memory,
        key: "memory",
        section: Section::Limits,
        unit: Unit::Size,
        default: 256 * MIB,
        headroom: Headroom::UpToMax(2 * GIB),
        min: MIN_MEMORY,
        max: 1 << 40,
        range_reason: "from 8M (the init and an interpreter must fit) to 1T",
        help: "Memory, with no swap beyond it (256M, 1G)",
    },
    Definition {
        knob: Knob::Cpus,
        key: "cpus",
        section: Section::Limits,
        unit: Unit::Cpus,
        default: 500,
        headroom: Headroom::UpToMax(2000),
        min: 10,
        max: 4096 * 1000,
        range_reason: "from 0.01 to 4096 CPUs",
        help: "CPU share, in CPUs (0.5 = half of one CPU's time)",
    },
    Definition {
        knob: Knob::Pids,
        key: "pids",
        section: Section::Limits,
        unit: Unit::Count,
        default: 64,
        headroom: Headroom::UpToMax(512),
        min: 1,
        max: MAX_PIDS,
        range_reason: "from 1 to 4194304 (the kernel's largest pids.max)",
        help: "Processes and threads the code may have at once (the sandbox's init comes on top)",
    },
    Definition {
        knob: Knob::OutputLimit,
        key: "output_limit",
        section: Section::Limits,
        unit: Unit::Size,
        default: MIB,
        headroom: Headroom::UpToMax(10 * MIB),
        min: 1,
        max: GIB,
        range_reason: "from 1 byte to 1G",
        help: "Cap on stdout + stderr; past it the sandbox is stopped (512K, 1M)",
    },
    Definition {
        knob: Knob::Nofile,
        key: "nofile",
        section: Section::Limits,
        unit: Unit::Count,
        // Docker's default soft limit. Open files are charged to the memory cgroup (struct
        // file, inodes, socket and pipe buffers; see ARCHITECTURE.md, "Kernel memory"), so
        // the limit is there for programs that leak fds, not for the host.
        default: 1024,
        headroom: Headroom::ProfileOnly,
        min: 16,
        max: 1 << 20,
        range_reason: "from 16 to 1048576 (the kernel's nr_open default)",
        help: "Open files per process (RLIMIT_NOFILE)",
    },
    Definition {
        knob: Knob::TmpSize,
        key: "tmp_size",
        section: Section::Filesystem,
        unit: Unit::Size,
        default: 64 * MIB,
        headroom: Headroom::LowerOnly,
        min: 64 * KIB,
        max: 1 << 40,
        range_reason: "from 64K to 1T",
        help: "Size of the tmpfs on /tmp (and /dev/shm)",
    },
    Definition {
        knob: Knob::WorkSize,
        key: "work_size",
        section: Section::Filesystem,
        unit: Unit::Size,
        default: 64 * MIB,
        headroom: Headroom::LowerOnly,
        min: 64 * KIB,
        max: 1 << 40,
        range_reason: "from 64K to 1T",
        help: "Size of the tmpfs on /work, the working directory",
    },
    Definition {
        knob: Knob::OutputFileSize,
        key: "max_size",
        section: Section::Outputs,
        unit: Unit::Size,
        default: 5 * MIB,
        headroom: Headroom::ProfileOnly,
        min: 1,
        max: 64 * MIB,
        range_reason: "from 1 byte to 64M",
        help: "Largest output file an agent may take back",
    },
    Definition {
        knob: Knob::OutputTotalSize,
        key: "max_total_size",
        section: Section::Outputs,
        unit: Unit::Size,
        default: 50 * MIB,
        headroom: Headroom::ProfileOnly,
        min: 1,
        max: GIB,
        range_reason: "from 1 byte to 1G",
        help: "Output files an agent may take back from one run or call, in all",
    },
    Definition {
        knob: Knob::OutputFiles,
        key: "max_files",
        section: Section::Outputs,
        unit: Unit::Count,
        default: 1000,
        headroom: Headroom::ProfileOnly,
        min: 1,
        max: 100_000,
        range_reason: "from 1 to 100000",
        help: "Output files taken back from one run or call, at most",
    },
    Definition {
        knob: Knob::InputFiles,
        key: "max_files",
        section: Section::Inputs,
        unit: Unit::Count,
        default: 1000,
        headroom: Headroom::ProfileOnly,
        min: 1,
        max: 100_000,
        range_reason: "from 1 to 100000",
        help: "Files a run or call may bring into /work, at most",
    },
    Definition {
        knob: Knob::InputTotalSize,
        key: "max_total_size",
        section: Section::Inputs,
        unit: Unit::Size,
        default: 50 * MIB,
        headroom: Headroom::ProfileOnly,
        min: 1,
        max: GIB,
        range_reason: "from 1 byte to 1G",
        help: "Files a run or call may bring into /work, in all",
    },
    Definition {
        knob: Knob::IdleTimeout,
        key: "idle_timeout",
        section: Section::Session,
        unit: Unit::Duration,
        default: 600 * SEC,
        headroom: Headroom::ProfileOnly,
        min: SEC,
        max: 7 * 24 * 3600 * SEC,
        range_reason: "from 1s to 7 days",
        help: "A session unused this long is closed",
    },
    Definition {
        knob: Knob::MaxDuration,
        key: "max_duration",
        section: Section::Session,
        unit: Unit::Duration,
        default: 3600 * SEC,
        headroom: Headroom::ProfileOnly,
        min: SEC,
        max: 7 * 24 * 3600 * SEC,
        range_reason: "from 1s to 7 days",
        help: "A session is closed this long after it was created, used or not",
    },
    Definition {
        knob: Knob::ProcessBuffer,
        key: "process_buffer",
        section: Section::Session,
        unit: Unit::Size,
        default: MIB,
        headroom: Headroom::ProfileOnly,
        min: 4 * KIB,
        max: 64 * MIB,
        range_reason: "from 4K to 64M (each stream of each process, in the server's memory)",
        help: "The output a session's process keeps per stream; past it the oldest bytes go \
               and a poll counts them",
    },
    Definition {
        knob: Knob::MaxBandwidth,
        key: "max_bandwidth",
        section: Section::Network,
        unit: Unit::Size,
        default: 100 * MIB,
        headroom: Headroom::LowerOnly,
        min: KIB,
        max: 1 << 40,
        range_reason: "from 1K to 1T bytes per second",
        help: "Network bytes per second through the gateway, in each direction (10M)",
    },
    Definition {
        knob: Knob::MaxConnections,
        key: "max_connections",
        section: Section::Network,
        unit: Unit::Count,
        default: 64,
        headroom: Headroom::LowerOnly,
        min: 1,
        max: 65_536,
        range_reason: "from 1 to 65536",
        help: "TCP connections through the gateway open at once",
    },
    Definition {
        knob: Knob::ConnectionIdleTimeout,
        key: "connection_idle_timeout",
        section: Section::Network,
        unit: Unit::Duration,
        default: 120 * SEC,
        headroom: Headroom::LowerOnly,
        min: SEC,
        max: 24 * 3600 * SEC,
        range_reason: "from 1s to 24h",
        help: "A connection through the gateway with no traffic this long is closed",
    },
];

impl Knob {
    /// The declaration.
    pub fn def(self) -> &'static Definition {
        KNOBS
            .iter()
            .find(|s| s.knob == self)
            .expect("every knob is declared in KNOBS")
    }

    pub fn key(self) -> &'static str {
        self.def().key
    }

    /// `--memory`, `--output-limit`.
    pub fn flag(self) -> String {
        format!("--{}", self.key().replace('_', "-"))
    }

    /// The profile key of its maximum, `max_memory`, if a request may go above the value.
    pub fn max_key(self) -> Option<String> {
        matches!(self.def().headroom, Headroom::UpToMax(_)).then(|| format!("max_{}", self.key()))
    }

    /// The limit a request may set whose API field is `key` (keys of requestable knobs
    /// are unique; other sections may reuse a key, see [`Knob::in_section_by_key`]).
    pub fn from_key(key: &str) -> Option<Knob> {
        KNOBS
            .iter()
            .find(|s| s.key == key && s.headroom != Headroom::ProfileOnly)
            .or_else(|| KNOBS.iter().find(|s| s.key == key))
            .map(|s| s.knob)
    }

    /// The knob of profile section `section` whose key is `key`.
    pub fn in_section_by_key(section: Section, key: &str) -> Option<Knob> {
        KNOBS
            .iter()
            .find(|s| s.section == section && s.key == key)
            .map(|s| s.knob)
    }

    /// Whether a request may set it at all.
    pub fn requestable(self) -> bool {
        self.def().headroom != Headroom::ProfileOnly
    }

    /// Checks `value` against the knob's range. The message says what is allowed; the
    /// caller says where the value came from.
    pub fn check(self, value: u64) -> Result<u64, String> {
        let s = self.def();
        if (s.min..=s.max).contains(&value) {
            Ok(value)
        } else {
            Err(format!(
                "{} is out of range: use {} (default {})",
                self.show(value),
                s.range_reason,
                self.show(s.default)
            ))
        }
    }

    /// Parses a value as users write it (a flag, a TOML or JSON string), and checks its range.
    pub fn parse(self, text: &str) -> Result<u64, String> {
        let value = match self.def().unit {
            Unit::Duration => parse_duration(text).and_then(|d| {
                let ms = d.as_secs_f64() * 1000.0;
                if ms < 1.0 {
                    Err(format!("{text:?} is shorter than 1ms"))
                } else {
                    Ok(ms.round() as u64)
                }
            })?,
            Unit::Size => parse_size(text)?,
            Unit::Count => text.trim().parse::<u64>().map_err(|_| {
                format!(
                    "{text:?} is not a whole number: use {}",
                    self.def().range_reason
                )
            })?,
            Unit::Cpus => {
                let form = "a number of CPUs (0.5, 1, 2)";
                let cpus: f64 = text
                    .trim()
                    .parse()
                    .map_err(|_| format!("{text:?} is not a number: use {form}"))?;
                if !cpus.is_finite() || cpus < 0.0 {
                    return Err(format!("{text:?} is out of range: use {form}"));
                }
                (cpus * 1000.0).round() as u64
            }
        };
        self.check(value)
    }

    /// Parses a value from a TOML or JSON document: a number (seconds, bytes, a count,
    /// CPUs) or a string as on the command line.
    pub fn from_raw(self, raw: &Raw) -> Result<u64, String> {
        match raw {
            Raw::Text(text) => self.parse(text),
            Raw::Int(n) if *n >= 0 => self.parse(&n.to_string()),
            Raw::Float(f) if self.def().unit == Unit::Cpus => self.parse(&f.to_string()),
            Raw::Int(n) => Err(format!(
                "{n} is out of range: use {}",
                self.def().range_reason
            )),
            Raw::Float(f) => Err(format!(
                "{f} is not allowed here: use a whole number or a string with a unit"
            )),
        }
    }

    /// Formats a value the way [`Knob::parse`] reads it.
    pub fn show(self, value: u64) -> String {
        match self.def().unit {
            Unit::Duration => format_duration(Duration::from_millis(value)),
            Unit::Size => format_size(value),
            Unit::Count => value.to_string(),
            Unit::Cpus => format_cpus(value),
        }
    }

    /// The value as a TOML/JSON value: a string with a unit, or a number.
    pub fn to_raw(self, value: u64) -> Raw {
        match self.def().unit {
            Unit::Duration | Unit::Size => Raw::Text(self.show(value)),
            Unit::Count => Raw::Int(value as i64),
            Unit::Cpus => Raw::Float(value as f64 / 1000.0),
        }
    }

    /// The knobs of one profile section.
    pub fn in_section(section: Section) -> impl Iterator<Item = Knob> {
        KNOBS
            .iter()
            .filter(move |s| s.section == section)
            .map(|s| s.knob)
    }

    pub fn all() -> impl Iterator<Item = Knob> {
        KNOBS.iter().map(|s| s.knob)
    }
}

impl fmt::Display for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

fn format_cpus(millis: u64) -> String {
    if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        let s = format!("{}.{:03}", millis / 1000, millis % 1000);
        s.trim_end_matches('0').to_string()
    }
}

/// A knob's value as a TOML or JSON document holds it. Read in one pass by its own
/// visitor (an untagged enum would buffer the value first, whatever its size).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Raw {
    Int(i64),
    Float(f64),
    Text(String),
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Raw, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Raw;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number, or a string with a unit")
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Raw, E> {
                Ok(Raw::Int(n))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Raw, E> {
                i64::try_from(n)
                    .map(Raw::Int)
                    .map_err(|_| E::custom("the number is too large"))
            }
            fn visit_f64<E: serde::de::Error>(self, f: f64) -> Result<Raw, E> {
                Ok(Raw::Float(f))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Raw, E> {
                Ok(Raw::Text(s.to_string()))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Raw, E> {
                Ok(Raw::Text(s))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Values by knob: what a profile section holds, or what a request asks for.
pub type Values = BTreeMap<Knob, u64>;

/// The knobs' defaults, and the defaults of their maxima.
pub fn defaults() -> (Values, Values) {
    let values = KNOBS.iter().map(|s| (s.knob, s.default)).collect();
    let maxes = KNOBS
        .iter()
        .filter_map(|s| match s.headroom {
            Headroom::UpToMax(max) => Some((s.knob, max)),
            _ => None,
        })
        .collect();
    (values, maxes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_knob_is_declared_once_with_a_default_in_range() {
        let mut seen = std::collections::BTreeSet::new();
        let mut keys = std::collections::BTreeSet::new();
        for s in KNOBS {
            assert!(seen.insert(s.knob), "{:?} declared twice", s.knob);
            assert!(
                keys.insert((s.section.name(), s.key)),
                "{} twice in [{}]",
                s.key,
                s.section.name()
            );
            assert_eq!(s.knob.def().key, s.key);
            assert!(s.knob.check(s.default).is_ok(), "{}", s.key);
            if let Headroom::UpToMax(max) = s.headroom {
                assert!(s.knob.check(max).is_ok() && max >= s.default, "{}", s.key);
            }
            assert_eq!(s.knob.parse(&s.knob.show(s.default)), Ok(s.default));
        }
        assert_eq!(seen.len(), Knob::all().count());
    }

    #[test]
    fn values_parse_in_their_unit_and_out_of_range_ones_say_why() {
        assert_eq!(Knob::Timeout.parse("500ms"), Ok(500));
        assert_eq!(Knob::Timeout.parse("2m"), Ok(120_000));
        assert_eq!(Knob::Memory.parse("1G"), Ok(1 << 30));
        assert_eq!(Knob::Cpus.parse("0.5"), Ok(500));
        assert_eq!(Knob::Cpus.show(1250), "1.25");
        assert_eq!(Knob::Pids.parse("64"), Ok(64));
        let e = Knob::Pids.parse("5000000").unwrap_err();
        assert!(e.contains("4194304"), "{e}");
        let e = Knob::Nofile.parse("1").unwrap_err();
        assert!(e.contains("16 to 1048576"), "{e}");
        let e = Knob::Cpus.parse("0").unwrap_err();
        assert!(e.contains("0.01"), "{e}");
        assert!(Knob::Memory.parse("1M").unwrap_err().contains("8M"));
        assert!(Knob::Pids
            .parse("many")
            .unwrap_err()
            .contains("whole number"));
        assert_eq!(Knob::Cpus.from_raw(&Raw::Float(0.25)), Ok(250));
        assert_eq!(Knob::Timeout.from_raw(&Raw::Int(30)), Ok(30_000));
        assert!(Knob::Memory.from_raw(&Raw::Float(1.5)).is_err());
    }

    #[test]
    fn flags_and_max_keys_follow_the_key() {
        assert_eq!(Knob::OutputLimit.flag(), "--output-limit");
        assert_eq!(Knob::Memory.max_key().as_deref(), Some("max_memory"));
        assert_eq!(Knob::TmpSize.max_key(), None);
        assert_eq!(Knob::from_key("work_size"), Some(Knob::WorkSize));
        assert!(!Knob::Nofile.requestable());
    }

    /// README.md's flag table and profiles/README.md's key table show every knob with its
    /// default, so the docs cannot drift from this table.
    #[test]
    fn the_docs_list_every_knob_with_its_default() {
        let readme = include_str!("../README.md");
        let profiles = include_str!("../profiles/README.md");
        for s in KNOBS {
            let default = format!("`{}`", s.knob.show(s.default));
            if s.knob.requestable() {
                let row = readme
                    .lines()
                    .find(|l| l.starts_with(&format!("| `{}", s.knob.flag())))
                    .unwrap_or_else(|| panic!("README.md has no row for {}", s.knob.flag()));
                assert!(
                    row.contains(&default),
                    "README.md row {row:?} lacks {default}"
                );
            }
            let row = profiles
                .lines()
                .find(|l| l.contains(&format!("`{}.{}`", s.section.name(), s.key)))
                .unwrap_or_else(|| panic!("profiles/README.md has no row for {}", s.key));
            assert!(
                row.contains(&default),
                "profiles/README.md row {row:?} lacks {default}"
            );
        }
    }
}
