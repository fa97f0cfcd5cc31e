//! The tools' descriptions, written at start from this server's profiles' figures (the
//! `#[tool]` macros only take constant text).

use super::{CodecageMcp, Language};
use crate::service;

impl CodecageMcp {
    /// The tools' descriptions, with this server's profiles' figures in them.
    pub(super) fn describe(&mut self) {
        let mcp = &self.state.config.mcp;
        let limits = |language: Language| -> String {
            let name = self.profile_name(language);
            match service::load_profile(&self.state, &name) {
                Ok(p) => {
                    use codecage::knobs::Knob;
                    format!(
                        "Limits (profile {name}): {} per call by default, up to {} with `timeout`; {} of memory; \
                         {} of output (stdout and stderr together).",
                        Knob::Timeout.show(p.value(Knob::Timeout)),
                        Knob::Timeout.show(p.max(Knob::Timeout)),
                        Knob::Memory.show(p.value(Knob::Memory)),
                        Knob::OutputLimit.show(p.value(Knob::OutputLimit)),
                    )
                }
                Err(_) => format!("Limits: those of the profile {name}."),
            }
        };
        let session_text = if self.connection.is_some() {
            "The interpreter persists across calls on this connection: variables, imports and functions stay \
             until reset_repl; files stay in /work. execute_python, execute_node and execute_shell share one \
             sandbox (each its own interpreter): a file one writes in /work the others read. \
             session_id is optional: give one from create_session to use that session instead."
                .to_string()
        } else {
            "Without session_id the code runs in a fresh sandbox that is gone after the call: nothing persists. \
             For a persistent interpreter (variables, imports, files in /work), call create_session first and \
             pass its session_id."
                .to_string()
        };
        let results = |shell: bool| {
            format!(
                "The result is the output (stdout, then stderr){}, and errors{}; {}files written under /work/out \
                 come back as resource links (read them with read_file). A call past its time limit is \
                 interrupted: the output so far is returned, marked as an error, and the result says whether \
                 the {} state survived.",
                if shell { " and the exit status" } else { ", the value of a trailing expression" },
                if shell { "" } else { " with their traceback" },
                if shell {
                    String::new()
                } else {
                    format!(
                        "figures (matplotlib, displayed images) come back as images (PNG, at most {} px on a side, \
                         {} per call); ",
                        mcp.image_max_edge, mcp.max_images
                    )
                },
                if shell { "shell's" } else { "interpreter's" }
            )
        };
        let descriptions = [
            (
                "execute_python",
                format!(
                    "Run Python 3 code (numpy, pandas, matplotlib in the default image). {session_text} The last \
                     expression's value is shown, as in a notebook; top-level await works. {} {}",
                    results(false),
                    limits(Language::Python)
                ),
            ),
            (
                "execute_node",
                format!(
                    "Run JavaScript or TypeScript in Node.js (a REPL: `const`/`let`, functions and require()d \
                     modules persist; TypeScript types are stripped; top-level await works). {session_text} \
                     {} {}",
                    results(false),
                    limits(Language::Node)
                ),
            ),
            (
                "execute_shell",
                format!(
                    "Run a bash command line (pipelines, coreutils, grep, sed, awk). {} `cd`, variables and \
                     functions persist; a non-zero exit status marks the result as an error. {} {}",
                    session_text.replace("interpreter persists", "shell persists").replace(
                        "variables, imports and functions stay until reset_repl",
                        "its state stays until reset_repl"
                    ),
                    results(true),
                    limits(Language::Shell)
                ),
            ),
            (
                "exec",
                format!(
                    "Run a command line with bash -c (builds, test runs, servers, git). It runs in the foreground \
                     up to yieldMs (default 10000 ms): if it ends by then, the answer is its output and exit status \
                     (a non-zero status marks it an error); else it goes on in the background and the answer says \
                     `running`, with its output so far and its sessionId for the process tool. background: true \
                     answers at once. Its output is kept as it comes, whoever polls (the last 1 MiB of each \
                     stream unless the profile's process_buffer says otherwise; the answers say how many bytes were dropped before it). Its stdin stays open for \
                     process action=write. timeout: seconds before it is killed (default 1800, at most the \
                     profile's). pty: true runs it on a terminal (80x24, TERM=xterm-256color) for programs that \
                     need one (REPLs, editors, pagers, TUIs): its output is then one stream, and process \
                     action=screen shows the terminal as a person sees it. {}",
                    if self.connection.is_some() {
                        "It runs in this connection's sandbox (the execute tools': the same /work and files), or in \
                         session_id's session."
                    } else {
                        "Needs the session_id of a session from create_session; it runs in that sandbox."
                    }
                ),
            ),
            (
                "process",
                format!(
                    "Manage the commands exec started, by the sessionId exec gave (a process id, not the \
                     session_id). action: list (every process, its status and output size); poll (its status and \
                     the output since your last poll of it, every byte once; each answer ends with [cursor \
                     STDOUT:STDERR]: give it back as cursor to resume from there, e.g. after reconnecting); log \
                     (the output kept, as lines: offset and limit, by default the last 200); write (data to its \
                     stdin; eof: true closes it); kill (signal, KILL by default: TERM, INT, HUP, ...); send-keys \
                     (keys by tmux's names: Enter, C-c, C-d, Up, Down, Tab, Escape, BSpace, PPage, F1, a character; \
                     modifiers C-, M-, S-); paste (text, bracketed when the program asked for it); submit (Enter); \
                     screen (a terminal's rows of text and cursor now). {}",
                    if self.connection.is_some() {
                        "session_id: optional, as for exec."
                    } else {
                        "Needs exec's session_id."
                    }
                ),
            ),
            (
                "reset_repl",
                format!(
                    "Restart an interpreter: its variables, imports and functions are gone; files in /work are \
                     kept. Use it when the state is broken or memory is full. {}",
                    if self.connection.is_some() {
                        "language: python (default), node or shell; or a session_id."
                    } else {
                        "Needs the session_id of a session from create_session."
                    }
                ),
            ),
            (
                "list_files",
                format!(
                    "List a directory of the sandbox's /work (type, size, name). {}",
                    self.files_text()
                ),
            ),
            (
                "read_file",
                format!(
                    "Read a file of /work: a PNG comes back as an image, text as text, anything else as an \
                     embedded resource (at most {} per file). {}",
                    codecage::knobs::Knob::OutputFileSize
                        .show(codecage::knobs::Knob::OutputFileSize.def().default),
                    self.files_text()
                ),
            ),
            (
                "write_file",
                format!(
                    "Write a file into /work (directories are made; an existing file is replaced), for the code \
                     to read: text, or bytes as base64 with encoding \"base64\". {}",
                    self.files_text()
                ),
            ),
            (
                "create_session",
                "Start a persistent session for python, node or shell and get its session_id, for the other \
                 tools' session_id. A session keeps its interpreter's state and its /work between calls. It \
                 ends after its idle time without a call (10 minutes by default), after its maximum lifetime \
                 (1 hour by default), or at close_session; the answer gives its figures. After that its id is \
                 refused with an error that says so."
                    .to_string(),
            ),
            (
                "close_session",
                "End a session from create_session now: its processes and files are gone.".to_string(),
            ),
        ];
        for (name, text) in descriptions {
            if let Some(route) = self.tool_router.map.get_mut(name) {
                route.attr.description = Some(text.into());
            }
        }
    }

    pub(super) fn files_text(&self) -> &'static str {
        if self.connection.is_some() {
            "Every language's tools share this connection's one sandbox and /work; or give a session_id."
        } else {
            "Needs the session_id of a session from create_session."
        }
    }
}
