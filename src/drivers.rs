//! The REPL drivers (drivers/ in the repository), built into the binary so that a sandbox
//! always gets the drivers of the launcher's own version: the init mounts them read-only
//! at [`crate::spec::DRIVERS_DIR`] in sandboxes that run sessions.

use crate::runner::Lang;
use crate::spec::DRIVERS_DIR;

/// Every file of the drivers, by name.
pub const FILES: &[(&str, &str)] = &[
    ("python.py", include_str!("../drivers/python.py")),
    (
        "codecage_mpl.py",
        include_str!("../drivers/codecage_mpl.py"),
    ),
    ("node.js", include_str!("../drivers/node.js")),
    ("bash.sh", include_str!("../drivers/bash.sh")),
    // Sourced by bash.sh by this name: a cell's errors read "bash: line N: ...".
    ("bash", include_str!("../drivers/bash-cell.sh")),
];

/// The program that runs a language's driver.
pub fn argv(lang: Lang) -> Vec<String> {
    let path = |file: &str| format!("{DRIVERS_DIR}/{file}");
    match lang {
        Lang::Python => vec!["python3".to_string(), "-u".into(), path("python.py")],
        Lang::Node => vec!["node".to_string(), path("node.js")],
        Lang::Typescript => vec!["node".to_string(), path("node.js"), "--typescript".into()],
        Lang::Bash => vec![
            "bash".to_string(),
            "--noprofile".into(),
            "--norc".into(),
            path("bash.sh"),
        ],
    }
}
