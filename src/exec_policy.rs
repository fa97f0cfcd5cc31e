//! What a sandbox may execute: a profile's `[exec]` (`security = "deny" | "allowlist" |
//! "full"`, `allowed`, `denied`), resolved against the image into the files the kernel lets
//! the payload execute ([`ExecAllowlist`]). The sandbox enforces it with two layers
//! (ARCHITECTURE.md, "Exec policy"): every mount `noexec` but a read-only bind of each file
//! here (so nothing else can be mapped executable, which stops the dynamic loader's
//! `ld.so PROGRAM` trick), and landlock's EXECUTE right only on the programs and their ELF
//! interpreters (so a library, mappable, still cannot be `execve`d).
//!
//! Names are resolved on the host, in the image's directory, before the sandbox starts:
//! a name along the sandbox's PATH, a path as it is; every symlink followed inside the
//! image (never out of it), so each entry is the real file's path in the sandbox. An ELF
//! program brings its interpreter (`PT_INTERP`) and the shared libraries it needs
//! (`DT_NEEDED`, recursively, through `DT_RUNPATH`/`DT_RPATH` and the system's library
//! directories); a script's `#!` interpreter must be allowed itself.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// `[exec] security`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecSecurity {
    /// No shell: runs of a program or of bash code, bash sessions and session processes
    /// are refused (a rule of the service and the front ends, not of the kernel: the
    /// language's interpreter may still start programs).
    Deny,
    /// Only the allowed programs can be executed, enforced by the kernel.
    Allowlist,
    /// Anything the image holds (the default; nothing is added to the sandbox).
    #[default]
    Full,
}

impl ExecSecurity {
    pub fn name(self) -> &'static str {
        match self {
            ExecSecurity::Deny => "deny",
            ExecSecurity::Allowlist => "allowlist",
            ExecSecurity::Full => "full",
        }
    }
}

/// `[exec] interpreter`: where the language's interpreter (python3, node, bash: the
/// program of a run of code, or a session context's driver) may run under an allowlist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InterpreterScope {
    /// Only if `allowed` lists it, and then for every process of the sandbox.
    #[default]
    Listed,
    /// For its own context only: a run's payload, a session context's driver and what
    /// they start get the interpreter in a ruleset (and a mount namespace) of their own;
    /// a session's processes and its other contexts do not.
    Context,
}

impl InterpreterScope {
    pub fn name(self) -> &'static str {
        match self {
            InterpreterScope::Listed => "listed",
            InterpreterScope::Context => "context",
        }
    }
}

/// A profile's `[exec]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecSection {
    pub security: ExecSecurity,
    /// Program names (looked up along the sandbox's PATH) or absolute paths.
    pub allowed: Vec<String>,
    /// The same; an entry here wins over `allowed` (compared as resolved files).
    pub denied: Vec<String>,
    /// Absolute paths of files or directories whose files may be mapped executable
    /// beyond what the allowed programs need by `DT_NEEDED`: what they `dlopen` (Python's
    /// extension modules, their libraries). Any ELF program in them can be started through
    /// the loader (`ld.so FILE`): list directories of libraries only.
    pub libraries: Vec<String>,
    /// Whether a person approves a command before it starts (src/exec_ask.rs): `off`,
    /// `on-miss` (a program not in `allowed`, or a construct a parse cannot judge),
    /// `always`. Under `full`, `allowed` and `denied` are then the programs that run
    /// without asking (the kernel enforces nothing).
    pub ask: crate::exec_ask::Ask,
    /// `[exec.args.PROGRAM]`: the arguments a program of `allowed` runs with without
    /// asking (with `ask`: anything else asks). The service's gate, not the kernel's.
    pub args: std::collections::BTreeMap<String, crate::exec_ask::ArgRule>,
    /// Where the language's interpreter may run when `allowed` does not list it.
    pub interpreter: InterpreterScope,
}

impl ExecSection {
    /// The checks that need no image: each entry a bare name or an absolute path; lists
    /// only with `allowlist`.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(bad) = self
            .libraries
            .iter()
            .find(|l| !l.starts_with('/') || l.contains('\0'))
        {
            return Err(format!("exec.libraries: {bad:?} is not an absolute path"));
        }
        for (key, list) in [("allowed", &self.allowed), ("denied", &self.denied)] {
            for entry in list {
                let bare = !entry.contains('/');
                if entry.is_empty()
                    || entry.chars().any(|c| c.is_whitespace() || c == '\0')
                    || !(bare || entry.starts_with('/'))
                    || (bare && (entry == "." || entry == ".."))
                {
                    return Err(format!(
                        "exec.{key}: {entry:?} is neither a program name (\"ls\") nor an absolute path \
                         (\"/usr/bin/ls\")"
                    ));
                }
            }
        }
        if self.security == ExecSecurity::Deny && self.ask != crate::exec_ask::Ask::Off {
            return Err(format!(
                "exec.ask = \"{}\" with security = \"deny\": nothing runs to be asked about; leave ask out or \
                 choose security = \"allowlist\" or \"full\"",
                self.ask.name()
            ));
        }
        if !self.args.is_empty() && self.ask == crate::exec_ask::Ask::Off {
            return Err(
                "exec.args takes effect only with ask = \"on-miss\" or \"always\": arguments are judged by the \
                 service's parse before a command starts (the kernel sees programs, not arguments)"
                    .into(),
            );
        }
        if let Some(name) = self.args.keys().find(|n| !self.allowed.contains(n)) {
            return Err(format!(
                "exec.args.{name}: {name} is not in exec.allowed (argument rules narrow an allowed program)"
            ));
        }
        let lists_as_ask = self.security == ExecSecurity::Full
            && self.ask == crate::exec_ask::Ask::OnMiss
            && self.libraries.is_empty();
        if self.security != ExecSecurity::Allowlist
            && !lists_as_ask
            && !(self.allowed.is_empty() && self.denied.is_empty() && self.libraries.is_empty())
        {
            return Err(format!(
                "exec.allowed, exec.denied and exec.libraries take effect only with security = \"allowlist\" (exec.allowed \
                 and exec.denied also with security = \"full\" and ask = \"on-miss\", as the programs that run \
                 without asking; this profile says security = \"{}\")",
                self.security.name()
            ));
        }
        if self.interpreter == InterpreterScope::Context && self.security != ExecSecurity::Allowlist
        {
            return Err(format!(
                "exec.interpreter = \"context\" takes effect only with security = \"allowlist\" (this profile \
                 says security = \"{}\", under which the interpreter runs anyway)",
                self.security.name()
            ));
        }
        if self.security == ExecSecurity::Allowlist && self.allowed.is_empty() {
            return Err(
                "exec.security = \"allowlist\" with an empty exec.allowed: nothing could run, not even the \
                 language's interpreter; list the programs (e.g. allowed = [\"bash\", \"ls\", \"cat\"])"
                    .into(),
            );
        }
        Ok(())
    }
}

/// An allowlist resolved against one image: paths in the sandbox, each a real file (no
/// symlink on the way), sorted and without repeats.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExecAllowlist {
    /// What the payload may `execve`: the allowed programs.
    pub programs: Vec<PathBuf>,
    /// Their ELF interpreters (the dynamic loader): executable too, since the kernel opens
    /// one as it opens the program (landlock checks EXECUTE on it).
    pub interpreters: Vec<PathBuf>,
    /// The shared libraries they need, and the profile's `libraries` (files or
    /// directories): on exec mounts (mappable), not executable.
    pub libraries: Vec<PathBuf>,
}

impl ExecAllowlist {
    /// The files that must sit on exec mounts.
    pub fn exec_mounted(&self) -> impl Iterator<Item = &PathBuf> {
        self.programs
            .iter()
            .chain(&self.interpreters)
            .chain(&self.libraries)
    }

    /// The files landlock lets the payload execute.
    pub fn executable(&self) -> impl Iterator<Item = &PathBuf> {
        self.programs.iter().chain(&self.interpreters)
    }

    /// This allowlist and `extra`'s files together (an approved command's ruleset).
    pub fn with(&self, extra: &ExecAllowlist) -> ExecAllowlist {
        // Linear: the lists are short, and this runs in the init (no sorting code there).
        let join = |a: &[PathBuf], b: &[PathBuf]| -> Vec<PathBuf> {
            let mut all = a.to_vec();
            for file in b {
                if !all.contains(file) {
                    all.push(file.clone());
                }
            }
            all
        };
        ExecAllowlist {
            programs: join(&self.programs, &extra.programs),
            interpreters: join(&self.interpreters, &extra.interpreters),
            libraries: join(&self.libraries, &extra.libraries),
        }
    }

    /// Whether `program` (a name along `path_var`, or a path) names an allowed program.
    pub fn allows(&self, root: &Path, path_var: &str, program: &str) -> Result<(), String> {
        let file = find_program(root, path_var, program)?;
        if self.programs.contains(&file) {
            return Ok(());
        }
        Err(format!(
            "{program} ({}) is not in exec.allowed",
            file.display()
        ))
    }
}

/// What `security = "deny"` refuses: `what` (a shell session, a process, a run of bash),
/// as the profile `profile` says.
pub fn denied(profile: &str, what: &str) -> String {
    format!(
        "{what} is refused: the profile {profile} says exec.security = \"deny\" (no shell, no programs started \
         by the client); use the profile's language, or a profile that allows it"
    )
}

/// `programs` (names or paths) with what they need (loaders, libraries), resolved as
/// `allowed` is: an approved command's or a context interpreter's own ruleset, beyond
/// the sandbox's.
pub fn resolve_programs(
    programs: &[String],
    root: &Path,
    path_var: &str,
) -> Result<ExecAllowlist, String> {
    let section = ExecSection {
        security: ExecSecurity::Allowlist,
        allowed: programs.to_vec(),
        ..Default::default()
    };
    resolve(&section, root, path_var)
}

/// A language's interpreter as its own context runs it (`interpreter = "context"`): the
/// program with its loader and libraries, and the image's library trees (/usr/lib,
/// /usr/local/lib, /lib64 ...) mappable as whole directories: what its extension modules
/// load (Python's lib-dynload, numpy's libraries in dist-packages, Node's addons), without
/// the profile listing an interpreter's internals. An interpreter runs anything anyway
/// (README: ctypes maps anonymous memory executable), so its own context loses nothing by
/// it; all of it is bound exec in that context's own mount namespace only, and landlock's
/// EXECUTE stays on the program and its loader. Whole directories also keep this cheap:
/// a handful of binds, no walk over every module's `DT_NEEDED`.
pub fn resolve_interpreter(
    program: &str,
    root: &Path,
    path_var: &str,
) -> Result<ExecAllowlist, String> {
    let mut list = resolve_programs(&[program.to_string()], root, path_var)?;
    let mut trees: Vec<PathBuf> = Vec::new();
    for dir in ["/usr/lib", "/usr/local/lib", "/lib", "/lib64", "/usr/lib64"] {
        // A merged-/usr image's /lib is /usr/lib: one bind.
        let Some(dir) = canonical_in(root, Path::new(dir)) else {
            continue;
        };
        if host_path(root, &dir).is_dir() && !trees.iter().any(|t| dir.starts_with(t)) {
            trees.retain(|t| !t.starts_with(&dir));
            trees.push(dir);
        }
    }
    list.libraries
        .retain(|l| !trees.iter().any(|t| l.starts_with(t)));
    list.libraries.extend(trees);
    Ok(list)
}

/// Resolves `section` (an allowlist) in the image at `root` (`/` for the host's), names
/// along `path_var`.
pub fn resolve(
    section: &ExecSection,
    root: &Path,
    path_var: &str,
) -> Result<ExecAllowlist, String> {
    let mut denied = BTreeSet::new();
    for name in &section.denied {
        // A denied name the image lacks cannot run anyway.
        if let Ok(file) = find_program(root, path_var, name) {
            denied.insert(file);
        }
    }
    let mut programs = BTreeSet::new();
    for name in &section.allowed {
        let file = find_program(root, path_var, name)?;
        if !denied.contains(&file) {
            programs.insert(file);
        }
    }
    let mut interpreters = BTreeSet::new();
    let mut libraries = BTreeSet::new();
    for program in &programs {
        let host = host_path(root, program);
        let mut head = [0u8; 256];
        let n = File::open(&host)
            .and_then(|f| f.read_at(&mut head, 0))
            .map_err(|e| format!("exec.allowed: cannot read {}: {e}", program.display()))?;
        let head = &head[..n];
        if let Some(line) = head.strip_prefix(b"#!") {
            let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
            let line = String::from_utf8_lossy(line);
            let interpreter = line.split_whitespace().next().unwrap_or_default();
            let allowed = canonical_in(root, Path::new(interpreter))
                .is_some_and(|file| programs.contains(&file));
            if !allowed {
                return Err(format!(
                    "exec.allowed: {} is a script run by {line:?}, and {interpreter} is not allowed; allow it too \
                     (and, for `/usr/bin/env NAME`, NAME), or remove the script",
                    program.display(),
                    line = line.trim()
                ));
            }
            continue;
        }
        if head.starts_with(b"\x7fELF") {
            let elf = Elf::read(&host)
                .map_err(|e| format!("exec.allowed: {}: {e}", program.display()))?;
            if let Some(interp) = &elf.interpreter {
                let file = canonical_in(root, Path::new(interp)).ok_or_else(|| {
                    format!(
                        "exec.allowed: {} names the interpreter {interp}, which the image lacks",
                        program.display()
                    )
                })?;
                interpreters.insert(file.clone());
                // The loader maps itself executable, and its own needs are none; listed
                // here too so that the walk below never adds it as a library.
                libraries.insert(file);
            }
            needed_closure(root, program, &elf, &mut libraries)?;
        }
    }
    for entry in &section.libraries {
        let file = canonical_in(root, Path::new(entry))
            .ok_or_else(|| format!("exec.libraries: the image has no {entry}"))?;
        libraries.insert(file);
    }
    for interpreter in &interpreters {
        libraries.remove(interpreter);
    }
    for program in &programs {
        libraries.remove(program);
    }
    Ok(ExecAllowlist {
        programs: programs.into_iter().collect(),
        interpreters: interpreters.into_iter().collect(),
        libraries: libraries.into_iter().collect(),
    })
}

/// `name` as `execvp` finds it in the sandbox: a path as it is, a bare name in the first
/// directory of `path_var` that holds it; the real file's path in the sandbox.
pub fn find_program(root: &Path, path_var: &str, name: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let is_program = |file: &Path| {
        std::fs::metadata(host_path(root, file))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.starts_with('/') {
        return canonical_in(root, Path::new(name))
            .filter(|file| is_program(file))
            .ok_or_else(|| format!("exec: {name} is not an executable file in the image"));
    }
    for dir in path_var.split(':').filter(|d| d.starts_with('/')) {
        if let Some(file) = canonical_in(root, &Path::new(dir).join(name)) {
            if is_program(&file) {
                return Ok(file);
            }
        }
    }
    Err(format!(
        "exec: no program {name:?} in the image's PATH ({path_var}); name one that the image has, or give its \
         absolute path"
    ))
}

/// `path` (absolute, in the sandbox) on the host: under `root`.
fn host_path(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The real path in the sandbox of `path`, every symlink followed as the sandbox would
/// (an absolute target starts again at `root`, `..` stops at it), or None if it does not
/// exist.
fn canonical_in(root: &Path, path: &Path) -> Option<PathBuf> {
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    let mut done = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            done.pop();
            continue;
        }
        let next = done.join(&part);
        let meta = std::fs::symlink_metadata(host_path(root, &next)).ok()?;
        if meta.file_type().is_symlink() {
            links += 1;
            if links > 40 {
                return None;
            }
            let target = std::fs::read_link(host_path(root, &next)).ok()?;
            if target.is_absolute() {
                done = PathBuf::from("/");
            }
            for c in target.components().rev() {
                match c {
                    Component::Normal(s) => pending.push(s.to_os_string()),
                    Component::ParentDir => pending.push("..".into()),
                    _ => {}
                }
            }
        } else {
            done = next;
        }
    }
    Some(done)
}

/// Adds the libraries `elf` (the file `file`, in the sandbox) needs, and theirs.
fn needed_closure(
    root: &Path,
    file: &Path,
    elf: &Elf,
    libraries: &mut BTreeSet<PathBuf>,
) -> Result<(), String> {
    let origin = file.parent().unwrap_or(Path::new("/"));
    let mut dirs: Vec<PathBuf> = elf
        .search_paths
        .iter()
        .flat_map(|p| p.split(':'))
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d.replace("$ORIGIN", &origin.to_string_lossy())))
        .collect();
    dirs.extend(system_library_dirs(root));
    for name in &elf.needed {
        let found = if name.contains('/') {
            canonical_in(root, Path::new(name))
        } else {
            dirs.iter()
                .find_map(|dir| canonical_in(root, &dir.join(name)))
        };
        let Some(lib) = found else {
            return Err(format!(
                "exec.allowed: {} needs the library {name}, which is not in the image's library directories",
                file.display()
            ));
        };
        if libraries.insert(lib.clone()) {
            let child = Elf::read(&host_path(root, &lib)).map_err(|e| {
                format!(
                    "exec.allowed: {} (needed by {}): {e}",
                    lib.display(),
                    file.display()
                )
            })?;
            needed_closure(root, &lib, &child, libraries)?;
        }
    }
    Ok(())
}

/// Where the dynamic loader looks after a program's own paths: the directories of
/// /etc/ld.so.conf.d/*.conf, then the multiarch and default ones.
fn system_library_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(entries) = std::fs::read_dir(host_path(root, Path::new("/etc/ld.so.conf.d"))) {
        let mut confs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        confs.sort();
        for conf in confs
            .iter()
            .filter(|c| c.extension().is_some_and(|e| e == "conf"))
        {
            if let Ok(text) = std::fs::read_to_string(conf) {
                dirs.extend(
                    text.lines()
                        .map(str::trim)
                        .filter(|l| l.starts_with('/'))
                        .map(PathBuf::from),
                );
            }
        }
    }
    let triplet = format!("{}-linux-gnu", std::env::consts::ARCH);
    for dir in [
        format!("/lib/{triplet}"),
        format!("/usr/lib/{triplet}"),
        "/lib64".into(),
        "/usr/lib64".into(),
        "/lib".into(),
        "/usr/lib".into(),
    ] {
        dirs.push(PathBuf::from(dir));
    }
    dirs
}

/// What the loader needs to know of an ELF file (64-bit, little-endian: the architectures
/// codecage builds for).
#[derive(Debug, Default)]
struct Elf {
    interpreter: Option<String>,
    needed: Vec<String>,
    /// DT_RUNPATH, else DT_RPATH.
    search_paths: Vec<String>,
}

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

impl Elf {
    fn read(path: &Path) -> Result<Elf, String> {
        let file = File::open(path).map_err(|e| format!("cannot open it: {e}"))?;
        let read = |offset: u64, len: usize| -> Result<Vec<u8>, String> {
            if len > 16 << 20 {
                return Err("an ELF table larger than 16 MiB".into());
            }
            let mut buf = vec![0u8; len];
            file.read_exact_at(&mut buf, offset)
                .map_err(|e| format!("reading {len} bytes at {offset}: {e}"))?;
            Ok(buf)
        };
        let header = read(0, 64)?;
        if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
            return Err("not a 64-bit little-endian ELF file".into());
        }
        let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at =
            |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
        let u64_at =
            |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        let (phoff, phentsize, phnum) = (
            u64_at(&header, 32),
            u16_at(&header, 54) as usize,
            u16_at(&header, 56) as usize,
        );
        if phentsize < 56 {
            return Err("program headers too small".into());
        }
        let table = read(phoff, phentsize * phnum)?;
        // (type, offset, vaddr, filesz)
        let headers: Vec<(u32, u64, u64, u64)> = (0..phnum)
            .map(|i| {
                let h = &table[i * phentsize..];
                (u32_at(h, 0), u64_at(h, 8), u64_at(h, 16), u64_at(h, 32))
            })
            .collect();
        let mut elf = Elf::default();
        for &(kind, offset, _, size) in &headers {
            if kind == PT_INTERP {
                let bytes = read(offset, size as usize)?;
                let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                elf.interpreter = Some(String::from_utf8_lossy(&bytes[..end]).into_owned());
            }
        }
        let Some(&(_, dyn_offset, _, dyn_size)) = headers.iter().find(|h| h.0 == PT_DYNAMIC) else {
            return Ok(elf); // static
        };
        let dynamic = read(dyn_offset, dyn_size as usize)?;
        let entries: Vec<(u64, u64)> = dynamic
            .chunks_exact(16)
            .map(|e| (u64_at(e, 0), u64_at(e, 8)))
            .take_while(|e| e.0 != DT_NULL)
            .collect();
        let Some(strtab) = entries.iter().find(|e| e.0 == DT_STRTAB).map(|e| e.1) else {
            return Ok(elf);
        };
        // The string table's file offset, through the PT_LOAD segment holding its address.
        let strtab = headers
            .iter()
            .find(|&&(kind, _, vaddr, size)| {
                kind == PT_LOAD && (vaddr..vaddr + size).contains(&strtab)
            })
            .map(|&(_, offset, vaddr, _)| strtab - vaddr + offset)
            .ok_or("its string table is outside every loaded segment")?;
        let string = |at: u64| -> Result<String, String> {
            let mut out = Vec::new();
            let mut chunk = [0u8; 64];
            let mut pos = strtab + at;
            loop {
                let n = file.read_at(&mut chunk, pos).map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("a string runs past the end of the file".into());
                }
                if let Some(end) = chunk[..n].iter().position(|&b| b == 0) {
                    out.extend_from_slice(&chunk[..end]);
                    return Ok(String::from_utf8_lossy(&out).into_owned());
                }
                out.extend_from_slice(&chunk[..n]);
                pos += n as u64;
                if out.len() > 4096 {
                    return Err("a string longer than 4096 bytes".into());
                }
            }
        };
        let mut rpath = Vec::new();
        let mut runpath = Vec::new();
        for &(tag, value) in &entries {
            match tag {
                DT_NEEDED => elf.needed.push(string(value)?),
                DT_RPATH => rpath.push(string(value)?),
                DT_RUNPATH => runpath.push(string(value)?),
                _ => {}
            }
        }
        elf.search_paths = if runpath.is_empty() { rpath } else { runpath };
        Ok(elf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = crate::spec::SANDBOX_PATH;

    #[test]
    fn the_hosts_ls_brings_its_loader_and_libc() {
        let section = ExecSection {
            security: ExecSecurity::Allowlist,
            allowed: vec!["ls".into(), "cat".into()],
            denied: vec!["cat".into()],
            libraries: vec![],
            ..ExecSection::default()
        };
        let list = resolve(&section, Path::new("/"), PATH).unwrap();
        assert_eq!(list.programs.len(), 1, "{list:?}");
        assert!(list.programs[0].ends_with("ls"), "{list:?}");
        assert!(
            list.interpreters
                .iter()
                .all(|i| i.to_string_lossy().contains("ld-linux")),
            "{list:?}"
        );
        assert!(
            list.libraries
                .iter()
                .any(|l| l.to_string_lossy().contains("libc.so")),
            "{list:?}"
        );
        // Every entry is a real file, not a link.
        for file in list.exec_mounted() {
            assert!(!std::fs::symlink_metadata(file)
                .unwrap()
                .file_type()
                .is_symlink());
        }
    }

    #[test]
    fn an_unknown_name_is_an_error_naming_it() {
        let section = ExecSection {
            security: ExecSecurity::Allowlist,
            allowed: vec!["ls".into(), "no-such-program-here".into()],
            denied: vec![],
            libraries: vec![],
            ..ExecSection::default()
        };
        let e = resolve(&section, Path::new("/"), PATH).unwrap_err();
        assert!(
            e.contains("no-such-program-here") && e.contains("PATH"),
            "{e}"
        );
    }

    /// An image of the test's own: a script whose interpreter is not allowed, and links
    /// that try to leave the image.
    #[test]
    fn a_script_needs_its_interpreter_and_links_stay_in_the_image() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let root = std::env::temp_dir().join(format!("codecage-exec-{}", std::process::id()));
        let bin = root.join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let script = bin.join("tool");
        std::fs::write(&script, "#!/usr/bin/python3\nprint(1)\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A link to the host's /usr/bin/ls resolves in the image, where there is none.
        symlink("/usr/bin/ls", bin.join("ls")).unwrap();
        symlink("../../../../../../usr/bin/ls", bin.join("up")).unwrap();
        let section = |allowed: &[&str]| ExecSection {
            security: ExecSecurity::Allowlist,
            allowed: allowed.iter().map(|s| s.to_string()).collect(),
            ..ExecSection::default()
        };
        let e = resolve(&section(&["tool"]), &root, "/usr/bin").unwrap_err();
        assert!(
            e.contains("/usr/bin/tool is a script") && e.contains("python3"),
            "{e}"
        );
        for name in ["ls", "up"] {
            let e = resolve(&section(&[name]), &root, "/usr/bin").unwrap_err();
            assert!(e.contains(name), "{e}");
        }
        assert_eq!(
            canonical_in(&root, Path::new("/usr/bin/tool")),
            Some("/usr/bin/tool".into())
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn entries_must_be_names_or_absolute_paths() {
        for bad in ["", "bin/ls", "a b", ".."] {
            let section = ExecSection {
                security: ExecSecurity::Allowlist,
                allowed: vec![bad.into()],
                denied: vec![],
                libraries: vec![],
                ..ExecSection::default()
            };
            assert!(section.validate().is_err(), "{bad:?}");
        }
        let full = ExecSection {
            security: ExecSecurity::Full,
            allowed: vec!["ls".into()],
            denied: vec![],
            libraries: vec![],
            ..ExecSection::default()
        };
        assert!(full.validate().unwrap_err().contains("allowlist"));
        let deny = ExecSection {
            security: ExecSecurity::Deny,
            ..ExecSection::default()
        };
        assert_eq!(deny.validate(), Ok(()));
        // ask: not with deny; under full with on-miss the lists are what runs unasked;
        // argument rules need ask and an allowed program.
        use crate::exec_ask::{ArgRule, Ask};
        let ask = |security, ask, allowed: &[&str], args: &[&str]| ExecSection {
            security,
            ask,
            allowed: allowed.iter().map(|s| s.to_string()).collect(),
            args: args
                .iter()
                .map(|a| (a.to_string(), ArgRule::default()))
                .collect(),
            ..ExecSection::default()
        };
        assert!(ask(ExecSecurity::Deny, Ask::Always, &[], &[])
            .validate()
            .unwrap_err()
            .contains("deny"));
        assert_eq!(
            ask(ExecSecurity::Full, Ask::OnMiss, &["ls"], &["ls"]).validate(),
            Ok(())
        );
        assert!(ask(ExecSecurity::Full, Ask::Always, &["ls"], &[])
            .validate()
            .is_err());
        assert!(ask(ExecSecurity::Allowlist, Ask::Off, &["ls"], &["ls"])
            .validate()
            .unwrap_err()
            .contains("exec.args"));
        assert!(ask(ExecSecurity::Allowlist, Ask::OnMiss, &["ls"], &["git"])
            .validate()
            .unwrap_err()
            .contains("exec.args.git"));
    }

    /// `interpreter = "context"` only under an allowlist; the host's python3 as a context
    /// brings its loader and the library trees (lib-dynload: what asyncio imports at a
    /// start).
    #[test]
    fn a_context_interpreter_needs_an_allowlist_and_brings_its_extension_modules() {
        let section = |security| ExecSection {
            security,
            allowed: vec!["bash".into()],
            interpreter: InterpreterScope::Context,
            ..ExecSection::default()
        };
        assert_eq!(section(ExecSecurity::Allowlist).validate(), Ok(()));
        let full = ExecSection {
            allowed: vec![],
            ..section(ExecSecurity::Full)
        };
        assert!(full.validate().unwrap_err().contains("exec.interpreter"));
        let Ok(list) = resolve_interpreter("python3", Path::new("/"), "/usr/bin:/bin") else {
            return; // no python3 on this host
        };
        let program = list.programs[0].to_string_lossy();
        assert!(program.starts_with("/usr/bin/python3."), "{list:?}");
        assert!(!list.interpreters.is_empty(), "{list:?}");
        // /usr/lib as a whole (lib-dynload and the system libraries under it), not file
        // by file.
        assert!(
            list.libraries.contains(&PathBuf::from("/usr/lib")),
            "{list:?}"
        );
        assert!(
            !(list.libraries.iter()).any(|l| l.to_string_lossy().starts_with("/usr/lib/")),
            "{list:?}"
        );
    }
}
