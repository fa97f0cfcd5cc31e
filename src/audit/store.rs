//! The audit database: SQLite in WAL mode, one `records` table. Any codecage process may
//! open it (the server's writer thread, a CLI run, `codecage audit`); SQLite's locks order
//! their writes.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::Value as Sql;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde_json::Value;

use super::record::{Filter, Record};
use super::{time, AuditConfig, End, Message, Start};

/// The schema's version (`PRAGMA user_version`).
const VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    ended_at INTEGER,
    via TEXT NOT NULL,
    caller TEXT NOT NULL,
    profile TEXT,
    language TEXT,
    session TEXT,
    code_sha256 TEXT,
    code_size INTEGER,
    code TEXT,
    argv TEXT,
    stdin_sha256 TEXT,
    stdin_size INTEGER,
    exit_code INTEGER,
    signal INTEGER,
    error TEXT,
    message TEXT,
    duration_ms REAL,
    cpu_ms REAL,
    peak_memory_bytes INTEGER,
    limits TEXT,
    limits_hit TEXT,
    layers TEXT,
    skipped_layers TEXT,
    input_files TEXT,
    output_files TEXT,
    files_skipped TEXT,
    network TEXT,
    stdout BLOB,
    stdout_size INTEGER,
    stdout_sha256 TEXT,
    stdout_cut INTEGER NOT NULL DEFAULT 0,
    stderr BLOB,
    stderr_size INTEGER,
    stderr_sha256 TEXT,
    stderr_cut INTEGER NOT NULL DEFAULT 0,
    details TEXT,
    writer TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_started ON records(started_at);
CREATE INDEX IF NOT EXISTS records_session ON records(session);
CREATE INDEX IF NOT EXISTS records_running ON records(writer) WHERE status = 'running';
";

pub struct Store {
    conn: Connection,
    /// This process, as the `writer` of its records.
    writer: String,
}

impl Store {
    /// Opens the database to write, creating it and its directory with the configured
    /// modes (0700 and 0600, or 0750 and 0640 with `group`); existing ones are set to them.
    pub fn open_for_writing(config: &AuditConfig) -> Result<Store, String> {
        let path = &config.path;
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            format!(
                "audit database {}: {what}: {e} (set [audit] path, or enabled = false)",
                path.display()
            )
        };
        let gid = match &config.group {
            Some(name) => {
                crate::cli::full::name_service("[audit] group")?;
                Some(
                    nix::unistd::Group::from_name(name)
                        .ok()
                        .flatten()
                        .ok_or_else(|| format!("audit.group {name:?} does not exist"))?
                        .gid
                        .as_raw(),
                )
            }
            None => None,
        };
        let (dir_mode, file_mode) = if gid.is_some() {
            (0o750, 0o640)
        } else {
            (0o700, 0o600)
        };
        let dir = path
            .parent()
            .ok_or_else(|| fail("no directory", &"the path has no parent"))?;
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(dir_mode)
                .create(dir)
                .map_err(|e| fail("cannot create its directory", &e))?;
        }
        secure(dir, dir_mode, gid)
            .map_err(|e| fail("cannot set its directory's owner and mode", &e))?;
        // SQLite creates the -wal and -shm files with the database's mode.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(
            0o077 & !(file_mode & 0o070),
        ));
        let opened = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        );
        nix::sys::stat::umask(old);
        let conn = opened.map_err(|e| fail("cannot open", &e))?;
        for suffix in ["", "-wal", "-shm"] {
            let file = PathBuf::from(format!("{}{suffix}", path.display()));
            if file.exists() {
                secure(&file, file_mode, gid)
                    .map_err(|e| fail("cannot set its owner and mode", &e))?;
            }
        }
        let store = Store::prepare(conn, path)?;
        store
            .conn
            .execute_batch(SCHEMA)
            .map_err(|e| fail("cannot create its table", &e))?;
        store
            .conn
            .pragma_update(None, "user_version", VERSION)
            .map_err(|e| fail("cannot set its version", &e))?;
        Ok(store)
    }

    /// Opens an existing database (to read, and to prune).
    pub fn open_existing(path: &Path) -> Result<Store, String> {
        if !path.exists() {
            return Err(format!(
                "there is no audit database at {} (the [audit] path of the configuration)",
                path.display()
            ));
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .or_else(|_| {
            Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
        })
        .map_err(|e| format!("audit database {}: cannot open: {e}", path.display()))?;
        Store::prepare(conn, path)
    }

    fn prepare(conn: Connection, path: &Path) -> Result<Store, String> {
        let fail = |e: rusqlite::Error| format!("audit database {}: {e}", path.display());
        conn.busy_timeout(Duration::from_secs(10)).map_err(fail)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(fail)?;
        if version > VERSION {
            return Err(format!(
                "audit database {}: written by a newer codecage (schema {version}; this one knows {VERSION})",
                path.display()
            ));
        }
        let mode: String = conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
            .map_err(fail)?;
        if !mode.eq_ignore_ascii_case("wal")
            && !conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false)
        {
            return Err(format!(
                "audit database {}: cannot use WAL mode (got {mode})",
                path.display()
            ));
        }
        // A commit reaches the WAL file (the page cache) at once and survives the process
        // being killed; only a power loss may take the last ones (synchronous = FULL would
        // fsync every commit).
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(fail)?;
        // Pruned records are overwritten, not left in free pages.
        conn.pragma_update(None, "secure_delete", "ON")
            .map_err(fail)?;
        Ok(Store {
            conn,
            writer: writer_identity(),
        })
    }

    /// Marks `running` records of writer processes that no longer exist `incomplete`.
    pub fn sweep(&mut self) -> rusqlite::Result<usize> {
        let writers: Vec<String> = {
            let mut stmt = self
                .conn
                .prepare("SELECT DISTINCT writer FROM records WHERE status = 'running'")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let mut marked = 0;
        for writer in writers.iter().filter(|w| !writer_alive(w)) {
            marked += self.conn.execute(
                "UPDATE records SET status = 'incomplete', message = COALESCE(message, \
                 'the codecage process that recorded it ended (killed or crashed) before the execution did') \
                 WHERE writer = ?1 AND status = 'running'",
                params![writer],
            )?;
        }
        Ok(marked)
    }

    /// Writes the batch in order, each run of records in one transaction; what is written
    /// leaves the batch, so on an error the rest is kept for the next attempt.
    pub(super) fn write(
        &mut self,
        batch: &mut Vec<Message>,
        config: &AuditConfig,
    ) -> Result<(), String> {
        while !batch.is_empty() {
            let records = batch
                .iter()
                .position(|m| matches!(m, Message::Prune { .. } | Message::Flush { .. }))
                .unwrap_or(batch.len());
            if records > 0 {
                let tx = self.conn.transaction().map_err(|e| e.to_string())?;
                for message in &batch[..records] {
                    write_one(&tx, message, config, &self.writer).map_err(|e| e.to_string())?;
                }
                tx.commit().map_err(|e| e.to_string())?;
                batch.drain(..records);
                continue;
            }
            match batch.remove(0) {
                Message::Prune { before, done } => {
                    let _ = done.send(self.prune(before).map_err(|e| e.to_string()));
                }
                Message::Flush { done } => {
                    let _ = done.send(());
                }
                _ => unreachable!("records are written above"),
            }
        }
        Ok(())
    }

    /// Deletes the records that started before `before` (Unix ms) and are not running,
    /// then truncates the WAL so their pages leave it too.
    pub fn prune(&mut self, before: i64) -> rusqlite::Result<usize> {
        let n = self.conn.execute(
            "DELETE FROM records WHERE started_at < ?1 AND status != 'running'",
            params![before],
        )?;
        let _ = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        Ok(n)
    }

    /// The records the filter selects: newest first up to its limit, or all oldest first.
    /// `full` includes code and output.
    pub fn query(&self, filter: &Filter, full: bool) -> rusqlite::Result<Vec<Record>> {
        let mut records = Vec::new();
        self.each(filter, full, |r| {
            records.push(r);
            true
        })?;
        Ok(records)
    }

    /// The records `filter` selects, one at a time to `f` (which returns false to stop):
    /// an export of any size holds one record at once.
    pub fn each(
        &self,
        filter: &Filter,
        full: bool,
        mut f: impl FnMut(Record) -> bool,
    ) -> rusqlite::Result<()> {
        let mut clauses = Vec::new();
        let mut args: Vec<Sql> = Vec::new();
        let mut add = |clause: &str, value: Sql| {
            args.push(value);
            clauses.push(clause.replace('?', &format!("?{}", args.len())));
        };
        if let Some(t) = filter.since {
            add("started_at >= ?", Sql::Integer(t));
        }
        if let Some(t) = filter.until {
            add("started_at < ?", Sql::Integer(t));
        }
        for (column, value) in [
            ("profile", &filter.profile),
            ("session", &filter.session),
            ("kind", &filter.kind),
            ("caller", &filter.caller),
            ("status", &filter.status),
        ] {
            if let Some(v) = value {
                add(&format!("{column} = ?"), Sql::Text(v.clone()));
            }
        }
        match filter.error.as_deref() {
            Some("none") => clauses.push("error IS NULL".into()),
            Some(kind) => add("error = ?", Sql::Text(kind.to_string())),
            None => {}
        }
        let mut sql = format!("SELECT {} FROM records", COLUMNS.join(", "));
        if !clauses.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&clauses.join(" AND "));
        }
        match filter.limit {
            Some(n) => sql.push_str(&format!(" ORDER BY seq DESC LIMIT {n}")),
            None => sql.push_str(" ORDER BY seq ASC"),
        }
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| read_row(r, full))?;
        for row in rows {
            if !f(row?) {
                break;
            }
        }
        Ok(())
    }

    /// One record, whole.
    pub fn get(&self, id: &str) -> rusqlite::Result<Option<Record>> {
        let sql = format!("SELECT {} FROM records WHERE id = ?1", COLUMNS.join(", "));
        self.conn
            .query_row(&sql, params![id], |r| read_row(r, true))
            .optional()
    }
}

/// Owner root (group `gid` if given) and `mode`, on a directory or file of ours: opened
/// without following a symbolic link, then changed through that fd (no window in which
/// the path could be swapped for a link to something else).
fn secure(path: &Path, mode: u32, gid: Option<u32>) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::other("it is a symbolic link"),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if meta.uid() != 0 || gid.is_some_and(|g| meta.gid() != g) || (gid.is_none() && meta.gid() != 0)
    {
        std::os::unix::fs::fchown(&file, Some(0), Some(gid.unwrap_or(0)))?;
    }
    if meta.mode() & 0o7777 != mode {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

fn json_text(value: &Value) -> Option<String> {
    (!value.is_null()).then(|| value.to_string())
}

fn int(n: Option<u64>) -> Option<i64> {
    n.map(|n| n.min(i64::MAX as u64) as i64)
}

/// The code's hash and size: of the code, or of a program's argv joined by NUL bytes.
fn code_of(start: &Start) -> (Option<String>, Option<u64>) {
    if let Some((sha, size)) = &start.code_digest {
        return (Some(sha.clone()), Some(*size));
    }
    let bytes = match (&start.code, &start.argv) {
        (Some(code), _) => code.as_bytes().to_vec(),
        (None, Some(argv)) => argv.join("\0").into_bytes(),
        (None, None) => return (None, None),
    };
    (
        Some(codecage::files::sha256(&bytes)),
        Some(bytes.len() as u64),
    )
}

fn write_one(
    tx: &rusqlite::Transaction<'_>,
    message: &Message,
    config: &AuditConfig,
    writer: &str,
) -> rusqlite::Result<()> {
    match message {
        Message::Begin { id, at, start } => insert(tx, id, *at, start, "running", config, writer),
        Message::Whole { id, at, start, end } => {
            insert(tx, id, *at, start, "complete", config, writer)?;
            update(tx, id, *at, end)
        }
        Message::Finish { id, at, end } => update(tx, id, *at, end),
        Message::Prune { .. } | Message::Flush { .. } => Ok(()),
    }
}

fn insert(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    at: i64,
    start: &Start,
    status: &str,
    config: &AuditConfig,
    writer: &str,
) -> rusqlite::Result<()> {
    let (code_sha256, code_size) = code_of(start);
    let (code, argv) = if config.log_code {
        (
            start.code.clone(),
            start
                .argv
                .as_ref()
                .map(|a| Value::from(a.clone()).to_string()),
        )
    } else {
        (None, None)
    };
    let stdin = match (&start.stdin_digest, &start.stdin) {
        (Some((sha, size)), _) => Some((sha.clone(), *size)),
        (None, Some(s)) => Some((codecage::files::sha256(s), s.len() as u64)),
        (None, None) => None,
    };
    tx.prepare_cached(
        "INSERT INTO records (id, kind, status, started_at, via, caller, profile, language, session, \
         code_sha256, code_size, code, argv, stdin_sha256, stdin_size, limits, layers, input_files, details, writer) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
    )?
    .execute(params![
        id,
        start.kind.name(),
        status,
        at,
        start.via.name(),
        start.caller,
        start.profile,
        start.language,
        start.session,
        code_sha256,
        int(code_size),
        code,
        argv,
        stdin.as_ref().map(|s| s.0.clone()),
        int(stdin.as_ref().map(|s| s.1)),
        start.limits.as_ref().and_then(json_text),
        start.layers.as_ref().and_then(json_text),
        json_text(&Value::from(start.input_files.clone())),
        json_text(&start.details),
        writer,
    ])?;
    Ok(())
}

fn update(tx: &rusqlite::Transaction<'_>, id: &str, at: i64, end: &End) -> rusqlite::Result<()> {
    let stream = |c: &Option<super::Captured>| match c {
        Some(c) => (
            c.kept.clone(),
            int(Some(c.size)),
            Some(c.sha256.clone()),
            c.cut,
        ),
        None => (None, None, None, false),
    };
    let (stdout, stdout_size, stdout_sha256, stdout_cut) = stream(&end.stdout);
    let (stderr, stderr_size, stderr_sha256, stderr_cut) = stream(&end.stderr);
    let ms = |d: Option<Duration>| d.map(|d| (d.as_secs_f64() * 1e6).round() / 1e3);
    let hit = Value::from(end.limits_hit.clone());
    let layers_abi = end.landlock_abi.map(|abi| abi as i64);
    tx.prepare_cached(
        "UPDATE records SET status = 'complete', ended_at = ?2, exit_code = ?3, signal = ?4, error = ?5, \
         message = ?6, duration_ms = ?7, cpu_ms = ?8, peak_memory_bytes = ?9, limits_hit = ?10, \
         layers = CASE WHEN ?11 IS NULL THEN layers ELSE json_set(COALESCE(layers, '{}'), '$.landlock_abi', ?11) END, \
         skipped_layers = ?12, output_files = ?13, files_skipped = ?14, network = ?15, \
         stdout = ?16, stdout_size = ?17, stdout_sha256 = ?18, stdout_cut = ?19, \
         stderr = ?20, stderr_size = ?21, stderr_sha256 = ?22, stderr_cut = ?23, \
         details = CASE WHEN ?24 IS NULL THEN details ELSE json_patch(COALESCE(details, '{}'), ?24) END \
         WHERE id = ?1",
    )?
    .execute(params![
        id,
        at,
        end.exit_code,
        end.signal,
        end.error,
        end.message,
        ms(end.duration),
        ms(end.cpu),
        int(end.peak_memory),
        json_text(&hit),
        layers_abi,
        end.skipped_layers.as_ref().and_then(json_text),
        end.output_files.as_ref().and_then(json_text),
        end.files_skipped.as_ref().and_then(json_text),
        end.network.as_ref().and_then(json_text),
        stdout,
        stdout_size,
        stdout_sha256,
        stdout_cut,
        stderr,
        stderr_size,
        stderr_sha256,
        stderr_cut,
        json_text(&end.details),
    ])?;
    Ok(())
}

const COLUMNS: &[&str] = &[
    "id",
    "kind",
    "status",
    "started_at",
    "ended_at",
    "via",
    "caller",
    "profile",
    "language",
    "session",
    "code_sha256",
    "code_size",
    "code",
    "argv",
    "stdin_sha256",
    "stdin_size",
    "exit_code",
    "signal",
    "error",
    "message",
    "duration_ms",
    "cpu_ms",
    "peak_memory_bytes",
    "limits",
    "limits_hit",
    "layers",
    "skipped_layers",
    "input_files",
    "output_files",
    "files_skipped",
    "network",
    "stdout",
    "stdout_size",
    "stdout_sha256",
    "stdout_cut",
    "stderr",
    "stderr_size",
    "stderr_sha256",
    "stderr_cut",
    "details",
    "writer",
];

fn read_row(r: &rusqlite::Row<'_>, full: bool) -> rusqlite::Result<Record> {
    let json = |i: usize| -> rusqlite::Result<Option<Value>> {
        Ok(r.get::<_, Option<String>>(i)?
            .and_then(|t| serde_json::from_str(&t).ok()))
    };
    let list = |i: usize| -> rusqlite::Result<Value> {
        Ok(json(i)?.unwrap_or_else(|| Value::Array(Vec::new())))
    };
    let uint = |i: usize| -> rusqlite::Result<Option<u64>> {
        Ok(r.get::<_, Option<i64>>(i)?.map(|n| n.max(0) as u64))
    };
    let stream = |i: usize| -> rusqlite::Result<(Option<String>, Option<String>)> {
        if !full {
            return Ok((None, None));
        }
        Ok(match r.get::<_, Option<Vec<u8>>>(i)? {
            Some(bytes) => {
                let (encoding, text) = codecage::outcome::encode_stream(&bytes);
                let encoding = serde_json::to_value(encoding)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string));
                (Some(text), encoding)
            }
            None => (None, None),
        })
    };
    let (stdout, stdout_encoding) = stream(31)?;
    let (stderr, stderr_encoding) = stream(35)?;
    Ok(Record {
        id: r.get(0)?,
        kind: r.get(1)?,
        status: r.get(2)?,
        started_at: time::show(r.get(3)?),
        ended_at: r.get::<_, Option<i64>>(4)?.map(time::show),
        via: r.get(5)?,
        caller: r.get(6)?,
        profile: r.get(7)?,
        language: r.get(8)?,
        session: r.get(9)?,
        code_sha256: r.get(10)?,
        code_size: uint(11)?,
        code: if full { r.get(12)? } else { None },
        argv: if full {
            json(13)?.and_then(|v| serde_json::from_value(v).ok())
        } else {
            None
        },
        stdin_sha256: r.get(14)?,
        stdin_size: uint(15)?,
        exit_code: r.get(16)?,
        signal: r.get(17)?,
        error: r.get(18)?,
        message: r.get(19)?,
        duration_ms: r.get(20)?,
        cpu_ms: r.get(21)?,
        peak_memory_bytes: uint(22)?,
        limits: json(23)?,
        limits_hit: json(24)?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default(),
        layers: json(25)?,
        skipped_layers: json(26)?,
        input_files: list(27)?,
        output_files: list(28)?,
        files_skipped: list(29)?,
        network: list(30)?,
        stdout,
        stdout_encoding,
        stdout_size: uint(32)?,
        stdout_sha256: r.get(33)?,
        stdout_cut: r.get(34)?,
        stderr,
        stderr_encoding,
        stderr_size: uint(36)?,
        stderr_sha256: r.get(37)?,
        stderr_cut: r.get(38)?,
        details: json(39)?.unwrap_or(Value::Null),
        writer: r.get(40)?,
    })
}

/// This process: `BOOT:PIDNS:PID:START` (the boot id, the pid namespace's inode, the pid,
/// and its start time in clock ticks after boot), which no other process shares.
fn writer_identity() -> String {
    let pid = std::process::id();
    format!(
        "{}:{}:{pid}:{}",
        boot_id(),
        pid_namespace(),
        start_time(pid).unwrap_or(0)
    )
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// Field 22 of /proc/PID/stat.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split(' ').nth(19)?.parse().ok()
}

/// Whether the process a `writer` names still runs. A writer of another pid namespace of
/// this boot cannot be judged from here, and counts as alive.
fn writer_alive(writer: &str) -> bool {
    let fields: Vec<&str> = writer.split(':').collect();
    let [boot, ns, pid, start] = fields[..] else {
        return false;
    };
    if boot != boot_id() {
        return false;
    }
    if ns != pid_namespace().to_string() {
        return true;
    }
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    start_time(pid) == Some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        let me = writer_identity();
        assert!(writer_alive(&me), "{me}");
        let fields: Vec<&str> = me.split(':').collect();
        let other_start = format!("{}:{}:{}:{}", fields[0], fields[1], fields[2], 1);
        assert!(!writer_alive(&other_start));
        let other_boot = format!(
            "00000000-0000-0000-0000-000000000000:{}:{}:{}",
            fields[1], fields[2], fields[3]
        );
        assert!(!writer_alive(&other_boot));
        assert!(!writer_alive("garbage"));
    }
}
