//! `[exec] ask`: what a command line would start, found by parsing it as bash does
//! (brush-parser, see Cargo.toml for why that crate), and whether a person must approve it.
//!
//! [`analyze`] walks every pipeline segment, `&&`/`||`/`;` chain, subshell, brace group,
//! loop and conditional body, function body, `$(...)`, backticks, `<(...)`/`>(...)`,
//! here-document and the scripts given to `bash -c`/`sh -c`, and collects each program a
//! simple command names, with its arguments when they are static. What it cannot judge
//! without running the command is said in [`Analysis::unresolved`]: a program named by a
//! variable, a substitution or a pattern, `eval`, `source`, `alias`, `trap`, an
//! assignment to PATH or another variable that changes what a name means, a shell given a
//! script file, a runner (`sudo`, `find -exec`, ...) whose program is in its arguments.
//! `ask = "on-miss"` asks when any program is not allowed or anything is unresolved.
//!
//! This is the service's gate *before* a command runs; it is not the enforcement: under
//! `security = "allowlist"` the kernel refuses whatever the parse missed.

use std::path::{Path, PathBuf};

use brush_parser::ast;
use brush_parser::word::WordPiece;
use serde::{Deserialize, Serialize};

/// `[exec] ask`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ask {
    /// Commands run without asking (what the kernel allows).
    #[default]
    Off,
    /// A person approves a command any of whose programs is not allowed, or which the
    /// parser cannot judge.
    OnMiss,
    /// A person approves every command.
    Always,
}

impl Ask {
    pub fn name(self) -> &'static str {
        match self {
            Ask::Off => "off",
            Ask::OnMiss => "on-miss",
            Ask::Always => "always",
        }
    }
}

/// One program a command would start: its name as written (a name looked up along PATH,
/// or a path) and its arguments, or None when some argument is only known at run time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invocation {
    pub program: String,
    pub args: Option<Vec<String>>,
}

/// What [`analyze`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Analysis {
    /// Every program, in the order written (builtins that start nothing are left out).
    pub programs: Vec<Invocation>,
    /// What the parser cannot judge, each in words.
    pub unresolved: Vec<String>,
}

impl Analysis {
    /// The distinct program names.
    pub fn program_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for p in &self.programs {
            if !names.contains(&p.program) {
                names.push(p.program.clone());
            }
        }
        names
    }
}

/// Bash builtins and keywords that start no program and evaluate no text as code.
const INERT_BUILTINS: &[&str] = &[
    ":", "true", "false", "echo", "printf", "cd", "pwd", "export", "unset", "set", "shift", "read",
    "test", "[", "local", "declare", "typeset", "readonly", "return", "exit", "break", "continue",
    "wait", "jobs", "fg", "bg", "kill", "umask", "ulimit", "shopt", "type", "let", "getopts",
    "dirs", "pushd", "popd", "history", "times", "caller", "help", "disown", "suspend", "logout",
    "unalias", "compgen", "complete", "compopt",
];

/// Builtins that run text or files as code, or change what a name means.
const EVALUATING_BUILTINS: &[&str] = &[
    "eval",
    "source",
    ".",
    "alias",
    "trap",
    "enable",
    "fc",
    "mapfile",
    "readarray",
    "bind",
];

/// Variables whose value changes which program a name starts or what a shell runs.
const DANGEROUS_VARIABLES: &[&str] = &[
    "PATH",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "IFS",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "BASH_LOADABLES_PATH",
    "EXECIGNORE",
];

/// Shells whose `-c` script is parsed in turn.
const SHELLS: &[&str] = &["bash", "sh", "dash", "ash", "rbash", "busybox"];

/// Programs that start a program named in their arguments (or shells whose syntax is not
/// bash's), which are not followed: a command with one is unresolved. (`find` only with
/// `-exec`/`-ok`. Interpreters such as python3, perl or awk run anything too: allowing one
/// allows everything, as README says.)
const RUNNERS: &[&str] = &[
    "sudo",
    "doas",
    "su",
    "runuser",
    "chroot",
    "unshare",
    "nsenter",
    "flock",
    "setsid",
    "stdbuf",
    "ionice",
    "taskset",
    "chrt",
    "strace",
    "ltrace",
    "watch",
    "script",
    "parallel",
    "fakeroot",
    "systemd-run",
    "zsh",
    "ksh",
    "mksh",
    "fish",
    "csh",
    "tcsh",
];

/// How deep `bash -c` scripts and substitutions nest before the rest is unresolved.
const MAX_DEPTH: usize = 16;

/// Parses `command` (bash) and collects what it would start.
pub fn analyze(command: &str) -> Analysis {
    let mut walker = Walker::default();
    walker.script(command, 0);
    walker.out
}

#[derive(Default)]
struct Walker {
    out: Analysis,
}

impl Walker {
    fn unresolved(&mut self, why: String) {
        if !self.out.unresolved.contains(&why) {
            self.out.unresolved.push(why);
        }
    }

    fn script(&mut self, text: &str, depth: usize) {
        if depth > MAX_DEPTH {
            self.unresolved(format!("scripts nested deeper than {MAX_DEPTH}"));
            return;
        }
        let options = brush_parser::ParserOptions::default();
        let mut parser = brush_parser::Parser::new(std::io::Cursor::new(text.as_bytes()), &options);
        match parser.parse_program() {
            Ok(program) => {
                for list in &program.complete_commands {
                    self.compound_list(list, depth);
                }
            }
            Err(e) => self.unresolved(format!("the command does not parse as bash: {e}")),
        }
    }

    fn compound_list(&mut self, list: &ast::CompoundList, depth: usize) {
        for ast::CompoundListItem(and_or, _) in &list.0 {
            self.pipeline(&and_or.first, depth);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p, depth),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline, depth: usize) {
        for command in &pipeline.seq {
            self.command(command, depth);
        }
    }

    fn command(&mut self, command: &ast::Command, depth: usize) {
        match command {
            ast::Command::Simple(simple) => self.simple(simple, depth),
            ast::Command::Compound(compound, redirects) => {
                self.compound(compound, depth);
                if let Some(list) = redirects {
                    for r in &list.0 {
                        self.redirect(r, depth);
                    }
                }
            }
            ast::Command::Function(f) => {
                self.compound(&f.body.0, depth);
                if let Some(list) = &f.body.1 {
                    for r in &list.0 {
                        self.redirect(r, depth);
                    }
                }
            }
            ast::Command::ExtendedTest(test, redirects) => {
                self.extended_test(&test.expr, depth);
                if let Some(list) = redirects {
                    for r in &list.0 {
                        self.redirect(r, depth);
                    }
                }
            }
        }
    }

    fn extended_test(&mut self, expr: &ast::ExtendedTestExpr, depth: usize) {
        match expr {
            ast::ExtendedTestExpr::And(a, b) | ast::ExtendedTestExpr::Or(a, b) => {
                self.extended_test(a, depth);
                self.extended_test(b, depth);
            }
            ast::ExtendedTestExpr::Not(a) | ast::ExtendedTestExpr::Parenthesized(a) => {
                self.extended_test(a, depth)
            }
            ast::ExtendedTestExpr::UnaryTest(_, w) => {
                self.word(&w.value, depth);
            }
            ast::ExtendedTestExpr::BinaryTest(_, a, b) => {
                self.word(&a.value, depth);
                self.word(&b.value, depth);
            }
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand, depth: usize) {
        match compound {
            ast::CompoundCommand::Arithmetic(a) => self.arithmetic(&a.expr.value, depth),
            ast::CompoundCommand::ArithmeticForClause(f) => {
                for e in [&f.initializer, &f.condition, &f.updater]
                    .into_iter()
                    .flatten()
                {
                    self.arithmetic(&e.value, depth);
                }
                self.compound_list(&f.body.list, depth);
            }
            ast::CompoundCommand::BraceGroup(g) => self.compound_list(&g.list, depth),
            ast::CompoundCommand::Subshell(s) => self.compound_list(&s.list, depth),
            ast::CompoundCommand::ForClause(f) => {
                for w in f.values.iter().flatten() {
                    self.word(&w.value, depth);
                }
                self.compound_list(&f.body.list, depth);
            }
            ast::CompoundCommand::CaseClause(c) => {
                self.word(&c.value.value, depth);
                for item in &c.cases {
                    for p in &item.patterns {
                        self.word(&p.value, depth);
                    }
                    if let Some(list) = &item.cmd {
                        self.compound_list(list, depth);
                    }
                }
            }
            ast::CompoundCommand::IfClause(i) => {
                self.compound_list(&i.condition, depth);
                self.compound_list(&i.then, depth);
                for e in i.elses.iter().flatten() {
                    if let Some(c) = &e.condition {
                        self.compound_list(c, depth);
                    }
                    self.compound_list(&e.body, depth);
                }
            }
            ast::CompoundCommand::WhileClause(w) | ast::CompoundCommand::UntilClause(w) => {
                self.compound_list(&w.0, depth);
                self.compound_list(&w.1.list, depth);
            }
            ast::CompoundCommand::Coprocess(c) => self.command(&c.body, depth),
        }
    }

    /// `$(( ))` text: a substitution inside it is not followed.
    fn arithmetic(&mut self, text: &str, _depth: usize) {
        if text.contains("$(") || text.contains('`') {
            self.unresolved("a command substitution inside an arithmetic expression".into());
        }
    }

    fn redirect(&mut self, redirect: &ast::IoRedirect, depth: usize) {
        match redirect {
            ast::IoRedirect::File(_, _, target) => match target {
                ast::IoFileRedirectTarget::Filename(w)
                | ast::IoFileRedirectTarget::Duplicate(w) => {
                    self.word(&w.value, depth);
                }
                ast::IoFileRedirectTarget::Fd(_) => {}
                ast::IoFileRedirectTarget::ProcessSubstitution(_, s) => {
                    self.compound_list(&s.list, depth)
                }
            },
            ast::IoRedirect::HereDocument(_, doc) => {
                if doc.requires_expansion {
                    // The body is expanded as if double-quoted.
                    self.word(
                        &format!("\"{}\"", doc.doc.value.replace('"', "\\\"")),
                        depth,
                    );
                }
            }
            ast::IoRedirect::HereString(_, w) | ast::IoRedirect::OutputAndError(w, _) => {
                self.word(&w.value, depth);
            }
        }
    }

    /// Walks the substitutions of `word`; its value when it is static (no expansion).
    fn word(&mut self, word: &str, depth: usize) -> Option<String> {
        let options = brush_parser::ParserOptions::default();
        match brush_parser::word::parse(word, &options) {
            Ok(pieces) => {
                let mut value = Some(String::new());
                for piece in &pieces {
                    self.piece(&piece.piece, &mut value, depth);
                }
                value
            }
            Err(e) => {
                self.unresolved(format!("the word {word:?} does not parse: {e}"));
                None
            }
        }
    }

    fn piece(&mut self, piece: &WordPiece, value: &mut Option<String>, depth: usize) {
        let push = |value: &mut Option<String>, s: &str| {
            if let Some(v) = value.as_mut() {
                v.push_str(s)
            }
        };
        match piece {
            WordPiece::Text(s) | WordPiece::SingleQuotedText(s) => push(value, s),
            WordPiece::AnsiCQuotedText(_) => *value = None,
            WordPiece::EscapeSequence(s) => push(value, s.strip_prefix('\\').unwrap_or(s)),
            WordPiece::DoubleQuotedSequence(inner)
            | WordPiece::GettextDoubleQuotedSequence(inner) => {
                for p in inner {
                    self.piece(&p.piece, value, depth);
                }
            }
            WordPiece::TildeExpansion(_) => *value = None,
            WordPiece::ParameterExpansion(p) => {
                let text = format!("{p:?}");
                if text.contains("$(") || text.contains('`') || text.contains("<(") {
                    self.unresolved(
                        "a command substitution inside a parameter expansion (${...})".into(),
                    );
                }
                *value = None;
            }
            WordPiece::CommandSubstitution(script)
            | WordPiece::BackquotedCommandSubstitution(script) => {
                self.script(script, depth + 1);
                *value = None;
            }
            WordPiece::ArithmeticExpression(e) => {
                self.arithmetic(&e.value, depth);
                *value = None;
            }
        }
    }

    fn simple(&mut self, simple: &ast::SimpleCommand, depth: usize) {
        let mut words: Vec<Option<String>> = Vec::new();
        let mut assigned = Vec::new();
        for item in simple.prefix.iter().flat_map(|p| p.0.iter()) {
            self.item(item, true, &mut words, &mut assigned, depth);
        }
        if let Some(w) = &simple.word_or_name {
            let v = self.word(&w.value, depth);
            words.push(v);
        }
        for item in simple.suffix.iter().flat_map(|s| s.0.iter()) {
            self.item(item, false, &mut words, &mut assigned, depth);
        }
        for name in &assigned {
            if DANGEROUS_VARIABLES.contains(&name.as_str()) {
                self.unresolved(format!(
                    "it assigns {name}, which changes what a program name or a shell starts"
                ));
            }
        }
        self.invocation(&words, depth);
    }

    fn item(
        &mut self,
        item: &ast::CommandPrefixOrSuffixItem,
        prefix: bool,
        words: &mut Vec<Option<String>>,
        assigned: &mut Vec<String>,
        depth: usize,
    ) {
        match item {
            ast::CommandPrefixOrSuffixItem::IoRedirect(r) => self.redirect(r, depth),
            ast::CommandPrefixOrSuffixItem::Word(w) => {
                let v = self.word(&w.value, depth);
                words.push(v);
            }
            ast::CommandPrefixOrSuffixItem::AssignmentWord(a, w) => {
                let name = match &a.name {
                    ast::AssignmentName::VariableName(n)
                    | ast::AssignmentName::ArrayElementName(n, _) => n.clone(),
                };
                match &a.value {
                    ast::AssignmentValue::Scalar(v) => {
                        self.word(&v.value, depth);
                    }
                    ast::AssignmentValue::Array(values) => {
                        for (k, v) in values {
                            if let Some(k) = k {
                                self.word(&k.value, depth);
                            }
                            self.word(&v.value, depth);
                        }
                    }
                }
                if prefix {
                    assigned.push(name);
                } else {
                    // `declare X=...` and the like: the word as the builtin sees it.
                    words.push(Some(w.value.clone()));
                }
            }
            ast::CommandPrefixOrSuffixItem::ProcessSubstitution(_, s) => {
                self.compound_list(&s.list, depth);
                words.push(None);
            }
        }
    }

    /// A simple command's words after expansion (None where only known at run time).
    fn invocation(&mut self, words: &[Option<String>], depth: usize) {
        let Some(first) = words.first() else {
            return;
        };
        let Some(name) = first.clone() else {
            self.unresolved("a program named by a variable, a substitution or an expansion".into());
            return;
        };
        if name.is_empty() {
            return;
        }
        if name.contains(['*', '?', '[', '{']) {
            self.unresolved(format!("a program named by a pattern ({name})"));
            return;
        }
        let rest = &words[1..];
        let statics: Option<Vec<String>> = rest.iter().cloned().collect();
        if INERT_BUILTINS.contains(&name.as_str()) {
            if matches!(
                name.as_str(),
                "export" | "declare" | "typeset" | "local" | "readonly"
            ) {
                for w in rest.iter().flatten() {
                    let var = w.split('=').next().unwrap_or_default();
                    if w.contains('=') && DANGEROUS_VARIABLES.contains(&var) {
                        self.unresolved(format!(
                            "it assigns {var}, which changes what a program name or a shell starts"
                        ));
                    }
                }
            }
            return;
        }
        if EVALUATING_BUILTINS.contains(&name.as_str()) {
            self.unresolved(format!(
                "`{name}` runs text or a file as code, or renames commands, which a parse cannot follow"
            ));
            return;
        }
        match name.as_str() {
            "hash" => {
                if rest
                    .iter()
                    .any(|w| w.as_deref().is_none_or(|w| w.starts_with("-p")))
                {
                    self.unresolved("`hash -p` maps a name to another program".into());
                }
                return;
            }
            "exec" | "builtin" | "nohup" => {
                let skip = rest
                    .iter()
                    .take_while(|w| {
                        name == "exec" && w.as_deref().is_some_and(|w| w.starts_with('-'))
                    })
                    .count();
                if rest.iter().take(skip).any(|w| w.as_deref() == Some("-a")) {
                    self.unresolved("`exec -a` with a name given".into());
                    return;
                }
                if name == "nohup" {
                    self.push(&name, &statics);
                }
                self.invocation(&rest[skip..], depth);
                return;
            }
            "command" => {
                let opts: Vec<_> = rest
                    .iter()
                    .take_while(|w| w.as_deref().is_some_and(|w| w.starts_with('-')))
                    .collect();
                if opts
                    .iter()
                    .any(|w| matches!(w.as_deref(), Some(o) if o.contains('v') || o.contains('V')))
                {
                    return; // a lookup only
                }
                self.invocation(&rest[opts.len()..], depth);
                return;
            }
            _ => {}
        }
        let base = name.rsplit('/').next().unwrap_or(&name).to_string();
        self.push(&name, &statics);
        match base.as_str() {
            "env" => {
                let mut i = 0;
                while let Some(w) = rest.get(i) {
                    match w.as_deref() {
                        None => {
                            self.unresolved("`env` with an argument known only at run time".into());
                            return;
                        }
                        Some("-u" | "--unset" | "-C" | "--chdir") => i += 2,
                        Some(w) if w.starts_with("-S") || w.starts_with("--split-string") => {
                            self.unresolved("`env -S` splits a string into a command".into());
                            return;
                        }
                        Some(w) if w.starts_with('-') => i += 1,
                        Some(w) if w.contains('=') => {
                            let var = w.split('=').next().unwrap_or_default();
                            if DANGEROUS_VARIABLES.contains(&var) {
                                self.unresolved(format!(
                                    "it assigns {var}, which changes what a program name or a shell starts"
                                ));
                            }
                            i += 1;
                        }
                        Some(_) => break,
                    }
                }
                self.invocation(rest.get(i..).unwrap_or_default(), depth);
            }
            "nice" | "timeout" | "xargs" => {
                // Options with a value, then (timeout) the duration, then the program.
                let with_value: &[&str] = match base.as_str() {
                    "nice" => &["-n", "--adjustment"],
                    "timeout" => &["-s", "--signal", "-k", "--kill-after"],
                    _ => &[
                        "-I",
                        "-i",
                        "-n",
                        "-P",
                        "-d",
                        "-L",
                        "-l",
                        "-s",
                        "-E",
                        "-e",
                        "-a",
                        "--arg-file",
                        "--delimiter",
                        "--max-args",
                        "--max-procs",
                        "--replace",
                        "--max-lines",
                        "--max-chars",
                        "--eof",
                        "--process-slot-var",
                    ],
                };
                let mut i = 0;
                while let Some(w) = rest.get(i) {
                    match w.as_deref() {
                        None => {
                            self.unresolved(format!(
                                "`{base}` with an argument known only at run time"
                            ));
                            return;
                        }
                        Some(w) if with_value.contains(&w) => i += 2,
                        Some(w) if w.starts_with('-') && w != "-" => i += 1,
                        Some(_) => break,
                    }
                }
                if base == "timeout" {
                    i += 1;
                }
                match rest.get(i..) {
                    Some(tail) if !tail.is_empty() => self.invocation(tail, depth),
                    _ if base == "xargs" => self.push("echo", &None),
                    _ => {}
                }
            }
            shell if SHELLS.contains(&shell) => {
                if shell == "busybox" {
                    // `busybox rm ...` is rm.
                    if rest.is_empty() {
                        return;
                    }
                    self.invocation(rest, depth);
                    return;
                }
                let mut i = 0;
                let mut script = None;
                let mut saw_c = false;
                while let Some(w) = rest.get(i) {
                    match w.as_deref() {
                        Some(w)
                            if w.starts_with('-')
                                && w.len() > 1
                                && !w.starts_with("--")
                                && w.contains('c') =>
                        {
                            saw_c = true;
                            script = Some(rest.get(i + 1).cloned().flatten());
                            break;
                        }
                        Some("-o" | "-O" | "+O" | "+o") => i += 2,
                        Some(w) if w.starts_with(['-', '+']) && w.len() > 1 => i += 1,
                        _ => break,
                    }
                }
                match (saw_c, script) {
                    (true, Some(Some(text))) => self.script(&text, depth + 1),
                    (true, _) => self.unresolved(format!(
                        "`{shell} -c` with a script known only at run time (a substitution or a variable)"
                    )),
                    (false, _) => self.unresolved(format!(
                        "`{shell}` runs a script file or its standard input, whose commands a parse cannot see"
                    )),
                }
            }
            runner
                if RUNNERS.contains(&runner)
                    || (runner == "find"
                        && rest.iter().any(|w| {
                            matches!(
                                w.as_deref(),
                                Some("-exec" | "-execdir" | "-ok" | "-okdir") | None
                            )
                        })) =>
            {
                self.unresolved(format!(
                    "`{runner}` starts a program named in its arguments, which this parse does not follow"
                ));
            }
            _ => {}
        }
    }

    fn push(&mut self, program: &str, args: &Option<Vec<String>>) {
        self.out.programs.push(Invocation {
            program: program.to_string(),
            args: args.clone(),
        });
    }
}

/// Whether `analysis` needs a person under `ask`: None if not, else why.
/// `allowed(name)` says whether a program name (as written) runs without asking.
pub fn needs_approval(
    ask: Ask,
    analysis: &Analysis,
    mut allowed: impl FnMut(&str) -> bool,
    violations: &[String],
) -> Option<String> {
    match ask {
        Ask::Off => None,
        Ask::Always => Some("the profile says exec.ask = \"always\"".into()),
        Ask::OnMiss => {
            let missing: Vec<String> = analysis
                .program_names()
                .into_iter()
                .filter(|p| !allowed(p))
                .collect();
            let mut why = Vec::new();
            if !missing.is_empty() {
                why.push(format!("not in exec.allowed: {}", missing.join(", ")));
            }
            if !violations.is_empty() {
                why.push(format!("outside exec.args: {}", violations.join("; ")));
            }
            if !analysis.unresolved.is_empty() {
                why.push(format!(
                    "cannot be judged before it runs: {}",
                    analysis.unresolved.join("; ")
                ));
            }
            (!why.is_empty()).then(|| why.join("; "))
        }
    }
}

/// `[exec.args.PROGRAM]`: the arguments an allowed program runs with without asking (seed
/// 004's safe-bin profiles). Flags are words starting with `-` before a `--`; a short
/// cluster (`-fd`) is each of its letters; `--name=value` is `--name`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArgRule {
    /// The first positional argument (a subcommand: git's `status`) must be one of these.
    pub first: Vec<String>,
    pub min_positional: Option<usize>,
    pub max_positional: Option<usize>,
    /// When not empty, only these flags.
    pub allowed_flags: Vec<String>,
    /// Never these flags.
    pub denied_flags: Vec<String>,
    /// Flags that take the next word as their value (not a positional argument).
    pub value_flags: Vec<String>,
}

impl ArgRule {
    /// Whether `args` (None: known only at run time) keep to the rule; else why not.
    pub fn check(&self, program: &str, args: Option<&[String]>) -> Result<(), String> {
        let Some(args) = args else {
            return Err(format!("{program}: arguments known only at run time"));
        };
        let mut positional: Vec<&str> = Vec::new();
        let mut flags: Vec<String> = Vec::new();
        let mut words = args.iter();
        let mut only_positional = false;
        while let Some(word) = words.next() {
            if only_positional || word == "-" || !word.starts_with('-') {
                positional.push(word);
                continue;
            }
            if word == "--" {
                only_positional = true;
                continue;
            }
            let name = word.split('=').next().unwrap_or(word).to_string();
            if name.starts_with("--") {
                if self.value_flags.contains(&name) && !word.contains('=') {
                    words.next();
                }
                flags.push(name);
            } else {
                let letters: Vec<String> = name[1..].chars().map(|c| format!("-{c}")).collect();
                if letters.last().is_some_and(|l| self.value_flags.contains(l)) && name.len() == 2 {
                    words.next();
                }
                flags.extend(letters);
            }
        }
        for flag in &flags {
            if self.denied_flags.contains(flag) {
                return Err(format!("{program}: the flag {flag} is denied"));
            }
            if !self.allowed_flags.is_empty() && !self.allowed_flags.contains(flag) {
                return Err(format!(
                    "{program}: the flag {flag} is not among the allowed ({})",
                    self.allowed_flags.join(", ")
                ));
            }
        }
        if !self.first.is_empty()
            && !positional
                .first()
                .is_some_and(|p| self.first.iter().any(|f| f == p))
        {
            return Err(format!(
                "{program} {}: the first argument must be one of {}",
                positional.first().unwrap_or(&"(none)"),
                self.first.join(", ")
            ));
        }
        if self
            .min_positional
            .is_some_and(|min| positional.len() < min)
        {
            return Err(format!(
                "{program}: {} positional arguments, fewer than {}",
                positional.len(),
                self.min_positional.unwrap_or_default()
            ));
        }
        if self
            .max_positional
            .is_some_and(|max| positional.len() > max)
        {
            return Err(format!(
                "{program}: {} positional arguments, more than {}",
                positional.len(),
                self.max_positional.unwrap_or_default()
            ));
        }
        Ok(())
    }
}

/// The set of programs that run without asking: `names` resolved along `path_var` in the
/// image at `root` (unknown names are left out: they cannot run).
pub fn resolve_names(root: &Path, path_var: &str, names: &[String]) -> Vec<PathBuf> {
    names
        .iter()
        .filter_map(|n| crate::exec_policy::find_program(root, path_var, n).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(command: &str) -> (Vec<String>, Vec<String>) {
        let a = analyze(command);
        (a.program_names(), a.unresolved)
    }

    #[test]
    fn pipelines_chains_and_substitutions_are_all_found() {
        let (p, u) = names("ls | grep x && cat f || wc -l; (head -1 f) & { sort; }");
        assert_eq!(p, ["ls", "grep", "cat", "wc", "head", "sort"]);
        assert!(u.is_empty(), "{u:?}");
        let (p, u) = names("echo $(rm -rf /work) `id` \"$(whoami)\" < <(date) > >(tee x)");
        assert_eq!(p, ["rm", "id", "whoami", "date", "tee"], "{u:?}");
        assert!(u.is_empty(), "{u:?}");
        let (p, _) = names("for f in $(seq 3); do touch $f; done; if stat x; then uname; fi");
        assert_eq!(p, ["seq", "touch", "stat", "uname"]);
        let (p, _) = names("f() { shred x; }; X=$(hostname) cat <<EOF\n$(nproc)\nEOF");
        assert_eq!(p, ["shred", "hostname", "nproc", "cat"]);
    }

    #[test]
    fn quoting_does_not_hide_a_program() {
        for cmd in [
            "\\rm f",
            "'rm' f",
            "r\"m\" f",
            "command rm f",
            "exec rm f",
            "env A=1 rm f",
            "nohup rm f",
            "timeout 5 rm f",
            "xargs -n1 rm",
            "busybox rm f",
            "nice -n 5 rm",
        ] {
            let (p, u) = names(cmd);
            assert!(p.contains(&"rm".to_string()), "{cmd}: {p:?} {u:?}");
        }
        let a = analyze("git status --short");
        assert_eq!(
            a.programs[0].args,
            Some(vec!["status".into(), "--short".into()])
        );
    }

    #[test]
    fn what_a_parse_cannot_judge_is_said() {
        for cmd in [
            "$X f",
            "${CMD:-rm} f",
            "eval rm f",
            "alias l=rm; l f",
            "source ./x.sh",
            "bash -c \"$(echo rm) f\"",
            "sh x.sh",
            "PATH=/work:$PATH ls",
            "export PATH=/work",
            "/usr/bin/r? f",
            "sudo rm",
            "find . -exec rm {} +",
            "echo $(( $(rm x) ))",
            "if then fi (",
        ] {
            let (_, u) = names(cmd);
            assert!(!u.is_empty(), "{cmd}: nothing unresolved");
        }
        let (p, u) = names("bash -c 'ls | grep a; rm x'");
        assert_eq!(p, ["bash", "ls", "grep", "rm"], "{u:?}");
        assert!(u.is_empty(), "{u:?}");
        // `bash -c "$(echo rm) f"`: the script is unknown (echo is a builtin).
        let (p, u) = names("bash -c \"$(echo rm) f\"");
        assert_eq!(p, ["bash"]);
        assert!(u[0].contains("bash -c"), "{u:?}");
    }

    #[test]
    fn on_miss_asks_for_a_program_not_allowed_or_an_unresolved_construct() {
        let allowed = |p: &str| ["ls", "grep", "cat"].contains(&p);
        assert_eq!(
            needs_approval(Ask::OnMiss, &analyze("ls | grep x"), allowed, &[]),
            None
        );
        let why = needs_approval(Ask::OnMiss, &analyze("ls; rm x"), allowed, &[]).unwrap();
        assert!(why.contains("rm"), "{why}");
        let why = needs_approval(Ask::OnMiss, &analyze("ls $(date)"), allowed, &[]).unwrap();
        assert!(why.contains("date"), "{why}");
        assert!(needs_approval(Ask::OnMiss, &analyze("ls $(echo x)"), allowed, &[]).is_none());
        assert!(needs_approval(Ask::OnMiss, &analyze("cat $F"), allowed, &[]).is_none());
        assert!(needs_approval(Ask::OnMiss, &analyze("eval ls"), allowed, &[]).is_some());
        assert!(needs_approval(Ask::Always, &analyze("ls"), allowed, &[]).is_some());
        assert!(needs_approval(Ask::Off, &analyze("rm -rf /"), allowed, &[]).is_none());
    }

    #[test]
    fn argument_rules_allow_git_status_and_refuse_git_push() {
        let git = ArgRule {
            first: vec!["status".into(), "log".into(), "diff".into()],
            max_positional: Some(3),
            denied_flags: vec!["-c".into(), "--exec-path".into()],
            value_flags: vec!["-n".into()],
            ..ArgRule::default()
        };
        let check = |cmd: &str| {
            let a = analyze(cmd);
            git.check("git", a.programs[0].args.as_deref())
        };
        assert_eq!(check("git status --short"), Ok(()));
        assert_eq!(check("git log -n 5 --oneline"), Ok(()));
        assert!(check("git push origin main")
            .unwrap_err()
            .contains("first argument"));
        assert!(check("git -c core.pager=rm status")
            .unwrap_err()
            .contains("-c"));
        assert!(check("git --exec-path=/work status")
            .unwrap_err()
            .contains("--exec-path"));
        assert!(check("git status $X").unwrap_err().contains("run time"));
        assert!(check("git diff a b c d")
            .unwrap_err()
            .contains("more than 3"));
        let ls = ArgRule {
            allowed_flags: vec!["-l".into(), "-a".into()],
            ..ArgRule::default()
        };
        assert_eq!(ls.check("ls", Some(&["-la".into(), "/".into()])), Ok(()));
        assert!(ls
            .check("ls", Some(&["-lR".into()]))
            .unwrap_err()
            .contains("-R"));
    }

    #[test]
    fn a_long_pipeline_parses_in_milliseconds() {
        let line = (0..200)
            .map(|i| format!("grep -e p{i} $(cat f{i})"))
            .collect::<Vec<_>>()
            .join(" | ");
        let start = std::time::Instant::now();
        let a = analyze(&line);
        let took = start.elapsed();
        assert_eq!(a.programs.len(), 400);
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        eprintln!("200-segment pipeline with 200 substitutions parsed in {took:?}");
    }
}
