//! The server's live sessions: by opaque id, with their lifetimes (idle and maximum, from
//! the profile's `[session]`), reclaimed by a reaper task. A session serves one call at a
//! time; a second is refused (409), never queued behind the first.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::OwnedSemaphorePermit;

use codecage::processes::Processes;
use codecage::runner::Lang;
use codecage::session::{Interrupter, Session};

use super::Shared;
use crate::service::tenancy::Caller;
use crate::service::{Error, Kind};

/// How many ended sessions' ids are remembered, to answer "expired" rather than "unknown".
const REMEMBERED_EXPIRED: usize = 4096;

/// What a session's requests may ask for, from its profile.
#[derive(Debug, Clone)]
pub struct Caps {
    pub input_files: u64,
    pub input_total: u64,
    /// The largest file `GET .../files/{path}` sends.
    pub read_max: u64,
    /// The output directory, relative to /work.
    pub output_dir: String,
    /// The longest time limit a call may ask for.
    pub max_timeout: Duration,
    /// The profile says exec.security = "deny": no processes.
    pub exec_denied: bool,
    /// The profile's `[exec] ask`, when it asks.
    pub ask: Option<Arc<crate::service::approvals::AskGate>>,
    /// The bytes of output a process keeps per stream (the profile's `process_buffer`).
    pub process_buffer: usize,
}

/// One live session.
pub struct Entry {
    pub id: String,
    /// Who made it (`token:NAME` or `uid:N`): only it and admins see and use it.
    pub owner: String,
    /// Counts the session against its owner's `max_sessions` while it lives.
    _quota: SessionTicket,
    pub lang: Lang,
    pub profile: String,
    pub created: SystemTime,
    created_at: Instant,
    pub idle_timeout: Duration,
    pub max_duration: Duration,
    last_used: Mutex<Instant>,
    /// The session; None once it is closed.
    pub session: Mutex<Option<Session>>,
    pub interrupter: Interrupter,
    /// Its background processes (shared with the session: reachable while a call runs).
    pub processes: Processes,
    /// Its contexts (shared with the session: readable while a call runs).
    pub contexts: codecage::session::Contexts,
    /// Its /work from the host (stat, list, mkdir, move, remove, watch: while a call runs
    /// too, no claim needed).
    pub work: Option<Arc<codecage::workdir::WorkDir>>,
    /// Its polled watchers (`POST .../fs/watchers`), by id, with the last number given.
    pub watchers: Mutex<(
        u64,
        std::collections::BTreeMap<String, crate::service::fs::Polled>,
    )>,
    busy: AtomicBool,
    pub executions: AtomicU64,
    pub caps: Caps,
    /// The session's audit record, completed when it closes.
    pub audit: Mutex<Option<crate::audit::Pending>>,
    /// The audit records of its processes that still run, by process id: completed when
    /// their exit is seen (`service::processes::tend`) or the session closes.
    pub process_audits: Mutex<std::collections::BTreeMap<u64, crate::audit::Pending>>,
    _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

impl Entry {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        owner: String,
        quota: SessionTicket,
        profile: String,
        session: Session,
        idle_timeout: Duration,
        max_duration: Duration,
        caps: Caps,
        permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    ) -> Entry {
        Entry {
            id,
            owner,
            _quota: quota,
            lang: session.lang(),
            profile,
            created: SystemTime::now(),
            created_at: Instant::now(),
            idle_timeout,
            max_duration,
            last_used: Mutex::new(Instant::now()),
            interrupter: session.interrupter(),
            processes: session.processes(),
            process_audits: Mutex::default(),
            contexts: session.contexts(),
            work: session.work_dir(),
            watchers: Mutex::new((0, Default::default())),
            session: Mutex::new(Some(session)),
            busy: AtomicBool::new(false),
            executions: AtomicU64::new(0),
            caps,
            audit: Mutex::new(None),
            _permits: permits,
        }
    }

    /// Marks the session busy for the life of the guard; None if it already is.
    pub fn claim(self: &Arc<Self>) -> Option<Busy> {
        self.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Busy(self.clone()))
    }

    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    pub fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    pub fn last_used(&self) -> Instant {
        *self.last_used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// When the session ends unless used: the earlier of its idle and maximum limits.
    pub fn expires(&self) -> SystemTime {
        let now = Instant::now();
        let idle_end = self.last_used() + self.idle_timeout;
        let max_end = self.created_at + self.max_duration;
        let end = idle_end.min(max_end);
        SystemTime::now() + end.saturating_duration_since(now)
    }

    /// Past its maximum lifetime, or idle past its idle limit: no call and no running
    /// background process since.
    fn expired(&self, now: Instant) -> bool {
        let idle = now >= self.last_used() + self.idle_timeout && self.processes.running() == 0;
        idle || now >= self.created_at + self.max_duration
    }
}

/// The claim of a session's one call.
pub struct Busy(Arc<Entry>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.store(false, Ordering::Release);
    }
}

#[derive(Default)]
pub struct Registry {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<String, Arc<Entry>>,
    /// Ended sessions' ids, with their owners.
    expired: VecDeque<(String, String)>,
    /// Live (or starting) sessions by owner, against `max_sessions`.
    per_owner: HashMap<String, usize>,
}

/// One session (live, or being started) counted against its owner until dropped.
pub struct SessionTicket {
    registry: Arc<Mutex<Inner>>,
    owner: String,
}

impl Drop for SessionTicket {
    fn drop(&mut self) {
        let mut inner = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = inner.per_owner.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                inner.per_owner.remove(&self.owner);
            }
        }
    }
}

/// Why an id does not name a live session.
pub enum Missing {
    Expired,
    Unknown,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn insert(&self, entry: Entry) -> Arc<Entry> {
        let entry = Arc::new(entry);
        self.lock().sessions.insert(entry.id.clone(), entry.clone());
        entry
    }

    /// A place for one more session of `caller`, or 429 past its `max` (None: no quota
    /// of its own; the server's cap still holds).
    pub fn admit(&self, caller: &Caller, max: Option<usize>) -> Result<SessionTicket, Error> {
        let owner = caller.owner();
        let mut inner = self.lock();
        let now = inner.per_owner.entry(owner.clone()).or_insert(0);
        if let Some(max) = max {
            if *now >= max {
                return Err(Error::new(
                    Kind::Quota,
                    format!(
                        "this caller already holds {now} sessions, its limit (max_sessions = {max}); close one first"
                    ),
                )
                .retry_after(1));
            }
        }
        *now += 1;
        Ok(SessionTicket {
            registry: self.inner.clone(),
            owner,
        })
    }

    /// The session `id` if `caller` may see it: its owner, or an admin. To anyone else a
    /// live or ended session is `Unknown`, as one that never was: its existence is not
    /// revealed.
    pub fn get(&self, id: &str, caller: &Caller) -> Result<Arc<Entry>, Missing> {
        let inner = self.lock();
        match inner.sessions.get(id) {
            Some(entry) if caller.may_use(&entry.owner) => Ok(entry.clone()),
            Some(_) => Err(Missing::Unknown),
            None if inner
                .expired
                .iter()
                .any(|(e, owner)| e == id && caller.may_use(owner)) =>
            {
                Err(Missing::Expired)
            }
            None => Err(Missing::Unknown),
        }
    }

    /// The sessions `caller` may see: its own, or every one for an admin.
    pub fn list_for(&self, caller: &Caller) -> Vec<Arc<Entry>> {
        let mut mine: Vec<Arc<Entry>> = self
            .lock()
            .sessions
            .values()
            .filter(|e| caller.may_use(&e.owner))
            .cloned()
            .collect();
        mine.sort_by_key(|e| e.created);
        mine
    }

    pub fn list(&self) -> Vec<Arc<Entry>> {
        let mut all: Vec<Arc<Entry>> = self.lock().sessions.values().cloned().collect();
        all.sort_by_key(|e| e.created);
        all
    }

    /// Takes a session out; `expired` remembers its id as such.
    pub fn remove(&self, id: &str, expired: bool) -> Option<Arc<Entry>> {
        let mut inner = self.lock();
        let entry = inner.sessions.remove(id);
        if let (Some(entry), true) = (&entry, expired) {
            let owner = entry.owner.clone();
            inner.expired.push_back((id.to_string(), owner));
            if inner.expired.len() > REMEMBERED_EXPIRED {
                inner.expired.pop_front();
            }
        }
        entry
    }

    pub fn interrupt_all(&self) {
        for entry in self.lock().sessions.values() {
            entry.interrupter.interrupt();
        }
    }

    /// Closes every session (waiting for a running call to give its session back, which
    /// an interrupt makes quick). Returns how many were closed.
    pub async fn close_all(&self) -> usize {
        let entries: Vec<Arc<Entry>> = self.lock().sessions.drain().map(|(_, e)| e).collect();
        let count = entries.len();
        let closing = entries.into_iter().map(|entry| {
            tokio::task::spawn_blocking(move || close(&entry, "the server shut down"))
        });
        for task in closing {
            let _ = task.await;
        }
        count
    }
}

/// Closes an entry's session: every process killed, its cgroup removed; its audit record
/// is completed with `why`.
pub fn close(entry: &Entry, why: &str) {
    entry.interrupter.interrupt();
    let session = entry
        .session
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(session) = session {
        if let Err(e) = session.close() {
            tracing::warn!(session = %entry.id, error = %e, "closing a session left something behind");
        }
    }
    // Its processes died with its sandbox: their exits logged and audited.
    entry.processes.sandbox_gone();
    crate::service::processes::settle(entry);
    let pending = entry.audit.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(pending) = pending {
        pending.finish(crate::audit::End {
            message: Some(why.to_string()),
            duration: Some(entry.created.elapsed().unwrap_or_default()),
            details: serde_json::json!({
                "executions": entry.executions.load(Ordering::Relaxed),
            }),
            ..crate::audit::End::default()
        });
    }
}

/// Reclaims sessions past their idle or maximum lifetime, every second.
pub async fn reap_forever(state: Shared) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = Instant::now();
        let sessions = state.sessions.list();
        // The processes' exits and time limits, in sessions no call holds.
        for entry in sessions.iter().filter(|e| !e.is_busy()) {
            crate::service::processes::tend(entry);
        }
        crate::service::approvals::announce_expired(&state);
        let due: Vec<String> = sessions
            .into_iter()
            .filter(|e| !e.is_busy() && e.expired(now))
            .map(|e| e.id.clone())
            .collect();
        for id in due {
            if let Some(entry) = state.sessions.remove(&id, true) {
                tracing::info!(session = %id, "session expired; closing it");
                let _ = tokio::task::spawn_blocking(move || {
                    close(&entry, "expired (idle or maximum lifetime)")
                })
                .await;
            }
        }
    }
}
