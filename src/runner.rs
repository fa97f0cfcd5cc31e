//! The language runners: how `-c CODE` (or a file's contents) runs in each language. The
//! code is written to a file in the working directory and run from there, so tracebacks
//! and stack traces carry a file name and line numbers.

use serde::{Deserialize, Serialize};

use crate::files::InputFile;

/// A language codecage runs code in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Lang {
    Python,
    Node,
    Typescript,
    Bash,
}

impl std::str::FromStr for Lang {
    type Err = String;
    fn from_str(text: &str) -> Result<Lang, String> {
        Lang::ALL
            .into_iter()
            .find(|l| l.name() == text)
            .ok_or_else(|| {
                format!("{text:?} is not a language: use python, node, typescript or bash")
            })
    }
}

impl Lang {
    pub const ALL: [Lang; 4] = [Lang::Python, Lang::Node, Lang::Typescript, Lang::Bash];

    pub fn name(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::Node => "node",
            Lang::Typescript => "typescript",
            Lang::Bash => "bash",
        }
    }

    /// The language of a file, by its extension.
    pub fn from_extension(path: &std::path::Path) -> Option<Lang> {
        match path.extension()?.to_str()? {
            "py" => Some(Lang::Python),
            "js" | "cjs" | "mjs" => Some(Lang::Node),
            "ts" | "mts" | "cts" => Some(Lang::Typescript),
            "sh" | "bash" => Some(Lang::Bash),
            _ => None,
        }
    }

    /// The program to run `code` with, and the file it is written to in /work.
    pub fn program(self, code: &str) -> (Vec<String>, Vec<InputFile>) {
        let (file, argv): (&str, &[&str]) = match self {
            Lang::Python => ("main.py", &["python3", "main.py"]),
            // Node 18/20 decide CommonJS or ES module by the file name, not the content.
            Lang::Node if is_es_module(code) => ("main.mjs", &["node", "main.mjs"]),
            Lang::Node => ("main.cjs", &["node", "main.cjs"]),
            Lang::Typescript => ("main.ts", &["tsx", "main.ts"]),
            Lang::Bash => ("main.sh", &["bash", "main.sh"]),
        };
        let files = vec![InputFile::new(file, code.as_bytes())];
        (argv.iter().map(|s| s.to_string()).collect(), files)
    }
}

/// Whether JavaScript code is an ES module: a line that starts with an `import` or
/// `export` statement. (`import(...)`, the dynamic form, works in CommonJS too.)
fn is_es_module(code: &str) -> bool {
    code.lines().map(str::trim_start).any(|line| {
        let import = line
            .strip_prefix("import")
            .is_some_and(|rest| rest.starts_with([' ', '{', '*', '"', '\'']));
        import || line.starts_with("export ") || line.starts_with("export{")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn es_modules_are_told_from_commonjs() {
        assert!(is_es_module("import fs from 'fs';\nconsole.log(1)"));
        assert!(is_es_module(
            "  import { readFile } from 'node:fs/promises'"
        ));
        assert!(is_es_module("import './side-effect.js'"));
        assert!(is_es_module("export const x = 1"));
        assert!(!is_es_module(
            "const fs = require('fs');\nconst m = await import('x')"
        ));
        assert!(!is_es_module("console.log('import x from y')"));
    }

    #[test]
    fn each_language_writes_a_file_and_runs_it() {
        let (argv, files) = Lang::Python.program("print(1)");
        assert_eq!(argv, ["python3", "main.py"]);
        assert_eq!(files[0].path, "main.py");
        assert_eq!(
            Lang::Node.program("export default 1").0,
            ["node", "main.mjs"]
        );
        assert_eq!(
            Lang::Node.program("module.exports = 1").0,
            ["node", "main.cjs"]
        );
        assert_eq!(
            Lang::Typescript.program("let x: number = 1").0,
            ["tsx", "main.ts"]
        );
        assert_eq!(Lang::Bash.program("echo").0, ["bash", "main.sh"]);
    }
}
