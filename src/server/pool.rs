//! The warm pool: for each profile the operator lists, sandboxes built ahead of requests
//! (`launcher::Prepared`: the sandbox up to where the code arrives and, for Python, the
//! interpreter pre-started with the profile's `preload`) and sessions started ahead of
//! their creation. A request whose spec the pooled sandbox fits takes one; a refill task
//! per profile builds the next in the background. A pooled sandbox serves one request or
//! one session and is destroyed after it, never reused. Pooled sandboxes are built at
//! the lowest CPU weight and get the default one at their handover (see
//! `RunCgroup::set_background`): refills take the CPU requests leave idle.
//!
//! A refill also defers to the requests in flight (`Pool::quiet`, at most `MAX_DEFER`): a
//! burst of requests that drains the pool is served before the refills start competing
//! with it for the CPU, at any weight (the lowest weight orders a sandbox among the other
//! sandboxes only; the server's own threads and its clients are not among them).
//!
//! Every pooled sandbox holds a permit of the server's sandbox cap, so the pool counts
//! against it; a request that finds no room evicts an idle pooled sandbox before it waits
//! (`Pool::evict_one`). At shutdown the pool is emptied; after a crash its sandboxes die
//! with the server (their init's parent-death signal) and the next launcher sweeps their
//! cgroups, like any other's.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::Response;

use tokio::sync::{Notify, OwnedSemaphorePermit};

use codecage::launcher::Prepared;
use codecage::profile::{self, Profile};
use codecage::session::{Session, SessionSpec};
use codecage::Spec;

use super::Shared;

/// How long a refill waits after a failed build (a missing image, a full host) before
/// trying again.
const BACKOFF: Duration = Duration::from_secs(5);
/// How long a refill waits at most for the requests in flight to end before it builds.
const MAX_DEFER: Duration = Duration::from_millis(250);
/// How often a deferred refill looks again.
const DEFER_STEP: Duration = Duration::from_millis(2);

/// A pooled sandbox and its place under the server's cap.
pub struct Pooled<T> {
    pub item: T,
    pub permit: OwnedSemaphorePermit,
}

/// One profile's pool of one kind.
struct Shelf<T> {
    target: usize,
    ready: VecDeque<Pooled<T>>,
    building: usize,
    /// Woken when one is taken (or evicted): the refill task builds the next.
    wake: Arc<Notify>,
}

impl<T> Shelf<T> {
    fn new(target: usize) -> Shelf<T> {
        Shelf {
            target,
            ready: VecDeque::new(),
            building: 0,
            wake: Arc::new(Notify::new()),
        }
    }
}

/// The pools, by profile name.
#[derive(Default)]
pub struct Pool {
    runs: Mutex<HashMap<String, Shelf<Prepared>>>,
    sessions: Mutex<HashMap<String, Shelf<Session>>>,
    /// Requests being served (see [`count_requests`]).
    serving: AtomicUsize,
}

/// A request being served, until it is dropped.
struct Serving<'a>(&'a AtomicUsize);

impl Serving<'_> {
    fn new(count: &AtomicUsize) -> Serving<'_> {
        count.fetch_add(1, Ordering::Relaxed);
        Serving(count)
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts the requests in flight (a layer of every API router), which refills defer to.
/// A request counts until its handler has answered (or the client went away).
pub async fn count_requests(
    State(state): State<Shared>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let _serving = Serving::new(&state.pool.serving);
    next.run(request).await
}

/// How many of each the pool keeps, by profile (`[pool]` in the config, `--pool`). The
/// default is a small pool for the python profile; `runs = {}` turns a kind off.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Sandboxes for `POST /v1/run` (and MCP calls without a session), by profile.
    pub runs: BTreeMap<String, usize>,
    /// Sessions started ahead of `POST /v1/sessions`, by profile.
    pub sessions: BTreeMap<String, usize>,
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            runs: BTreeMap::from([("python".to_string(), 2)]),
            sessions: BTreeMap::from([("python".to_string(), 1)]),
        }
    }
}

impl PoolConfig {
    pub fn validate(&self, max_sandboxes: usize) -> Result<(), String> {
        let total: usize = self.runs.values().chain(self.sessions.values()).sum();
        if let Some((name, n)) = self
            .runs
            .iter()
            .chain(self.sessions.iter())
            .find(|(_, n)| **n > 64)
        {
            return Err(format!("pool {name} = {n}: at most 64 per profile"));
        }
        if total > max_sandboxes {
            return Err(format!(
                "the pool holds {total} sandboxes, more than limits.max_sandboxes ({max_sandboxes})"
            ));
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// Waits until no request is being served, for at most [`MAX_DEFER`]: a refill's build
    /// (an interpreter's start, its preload) then takes the CPU the requests leave.
    async fn quiet(&self) {
        let until = tokio::time::Instant::now() + MAX_DEFER;
        while self.serving.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(DEFER_STEP).await;
        }
    }

    /// A pooled sandbox of `profile` that fits `spec`, if one is ready.
    pub fn take_run(&self, profile: &str, spec: &Spec) -> Option<Pooled<Prepared>> {
        let mut runs = lock(&self.runs);
        let shelf = runs.get_mut(profile)?;
        let at = shelf.ready.iter().position(|p| p.item.fits(spec))?;
        let taken = shelf.ready.remove(at);
        shelf.wake.notify_one();
        taken
    }

    /// A pooled session of `profile` started from exactly `spec`, if one is ready.
    pub fn take_session(&self, profile: &str, spec: &SessionSpec) -> Option<Pooled<Session>> {
        // A started session's spec has its drivers mounted.
        let mut wanted = spec.clone();
        wanted.sandbox.drivers = true;
        let mut sessions = lock(&self.sessions);
        let shelf = sessions.get_mut(profile)?;
        let at = shelf.ready.iter().position(|p| *p.item.spec() == wanted)?;
        let taken = shelf.ready.remove(at);
        shelf.wake.notify_one();
        taken
    }

    /// Drops one idle pooled sandbox (a run's first, then a session's), freeing its place
    /// under the cap for a request. Whether there was one.
    pub fn evict_one(&self) -> bool {
        let evicted_run = lock(&self.runs)
            .values_mut()
            .find_map(|shelf| shelf.ready.pop_front());
        if let Some(pooled) = evicted_run {
            tokio::task::spawn_blocking(move || drop(pooled));
            return true;
        }
        let evicted_session = lock(&self.sessions)
            .values_mut()
            .find_map(|shelf| shelf.ready.pop_front());
        match evicted_session {
            Some(pooled) => {
                tokio::task::spawn_blocking(move || {
                    let _ = pooled.item.close();
                });
                true
            }
            None => false,
        }
    }

    /// How many are ready, by kind and profile (for `/healthz`-like reports and tests).
    pub fn ready(&self) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
        let runs = lock(&self.runs)
            .iter()
            .map(|(k, s)| (k.clone(), s.ready.len()))
            .collect();
        let sessions = lock(&self.sessions)
            .iter()
            .map(|(k, s)| (k.clone(), s.ready.len()))
            .collect();
        (runs, sessions)
    }

    /// Empties the pool (shutdown): every pooled sandbox is killed and its cgroup removed.
    pub async fn drain(&self) {
        let runs: Vec<Pooled<Prepared>> = lock(&self.runs)
            .values_mut()
            .flat_map(|s| {
                s.target = 0;
                s.ready.drain(..).collect::<Vec<_>>()
            })
            .collect();
        let sessions: Vec<Pooled<Session>> = lock(&self.sessions)
            .values_mut()
            .flat_map(|s| {
                s.target = 0;
                s.ready.drain(..).collect::<Vec<_>>()
            })
            .collect();
        let _ = tokio::task::spawn_blocking(move || {
            drop(runs);
            for pooled in sessions {
                let _ = pooled.item.close();
            }
        })
        .await;
    }
}

/// Starts a refill task for each configured profile; each builds until its shelf holds
/// its target, then waits to be woken. A profile that cannot be resolved is reported and
/// left out.
pub fn start(state: &Shared, config: &PoolConfig) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for (name, &target) in &config.runs {
        if target == 0 {
            continue;
        }
        let profile = match crate::service::load_profile(state, name) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(profile = %name, error = %e.message(), "no run pool for this profile");
                continue;
            }
        };
        let spec = match profile::pool_spec(&profile, name, &state.data_dir) {
            Ok(spec) => spec,
            Err(e) => {
                tracing::warn!(profile = %name, error = %e, "no run pool for this profile");
                continue;
            }
        };
        let shelf = Shelf::new(target);
        let wake = shelf.wake.clone();
        lock(&state.pool.runs).insert(name.clone(), shelf);
        let preload = profile.preload.clone();
        tasks.push(tokio::spawn(refill(
            state.clone(),
            |pool| &pool.runs,
            name.clone(),
            "building a pooled sandbox",
            Arc::new(move || Prepared::build(&spec, Some(&preload))),
            drop,
            wake,
        )));
    }
    for (name, &target) in &config.sessions {
        if target == 0 {
            continue;
        }
        let spec = match session_spec(state, name) {
            Ok(spec) => spec,
            Err(e) => {
                tracing::warn!(profile = %name, error = %e, "no session pool for this profile");
                continue;
            }
        };
        let shelf = Shelf::new(target);
        let wake = shelf.wake.clone();
        lock(&state.pool.sessions).insert(name.clone(), shelf);
        tasks.push(tokio::spawn(refill(
            state.clone(),
            |pool| &pool.sessions,
            name.clone(),
            "starting a pooled session",
            Arc::new(move || Session::start_ahead(spec.clone())),
            |session| drop(session.close()),
            wake,
        )));
    }
    tasks
}

/// The session a `POST /v1/sessions` with only this profile (no limits, no env) starts.
fn session_spec(state: &Shared, name: &str) -> Result<SessionSpec, String> {
    let profile: Profile =
        crate::service::load_profile(state, name).map_err(|e| e.message().to_string())?;
    let lang = profile
        .language
        .ok_or_else(|| format!("the profile {name} has no language"))?;
    crate::service::session_spec_of(&profile, name, lang, &Default::default(), &state.data_dir)
        .map_err(|e| e.message().to_string())
}

/// Waits for a place under the server's sandbox cap without queueing behind requests:
/// a pool only fills room nobody asks for.
async fn permit(state: &Shared) -> Option<OwnedSemaphorePermit> {
    loop {
        if state.shutdown.is_cancelled() {
            return None;
        }
        if let Ok(p) = state.sandboxes.clone().try_acquire_owned() {
            return Some(p);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = state.shutdown.cancelled() => return None,
        }
    }
}

/// Whether `shelf` wants one more; counts it as building if so.
fn wants<T>(shelves: &Mutex<HashMap<String, Shelf<T>>>, name: &str) -> bool {
    let mut shelves = lock(shelves);
    match shelves.get_mut(name) {
        Some(s) if s.ready.len() + s.building < s.target => {
            s.building += 1;
            true
        }
        _ => false,
    }
}

fn built<T>(
    shelves: &Mutex<HashMap<String, Shelf<T>>>,
    name: &str,
    item: Option<Pooled<T>>,
) -> Option<Pooled<T>> {
    let mut shelves = lock(shelves);
    let Some(shelf) = shelves.get_mut(name) else {
        return item;
    };
    shelf.building -= 1;
    match item {
        // A shelf emptied meanwhile (shutdown) does not take it back.
        Some(item) if shelf.ready.len() < shelf.target => {
            shelf.ready.push_back(item);
            None
        }
        other => other,
    }
}

/// The shelves of one kind in the pool: its runs or its sessions.
type Shelves<T> = fn(&Pool) -> &Mutex<HashMap<String, Shelf<T>>>;

/// Keeps the shelf `name` full: builds each item with `make` on a blocking thread, under
/// a permit of the server's sandbox cap, and hands `discard` what a shelf emptied
/// meanwhile (shutdown) does not take back; after a failure, waits before the next try.
async fn refill<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    state: Shared,
    shelves: Shelves<T>,
    name: String,
    doing: &'static str,
    make: Arc<dyn Fn() -> Result<T, E> + Send + Sync>,
    discard: fn(T),
    wake: Arc<Notify>,
) {
    loop {
        while wants(shelves(&state.pool), &name) {
            let Some(permit) = permit(&state).await else {
                built::<T>(shelves(&state.pool), &name, None);
                return;
            };
            state.pool.quiet().await;
            let make = make.clone();
            match tokio::task::spawn_blocking(move || make()).await {
                Ok(Ok(item)) => {
                    if let Some(extra) =
                        built(shelves(&state.pool), &name, Some(Pooled { item, permit }))
                    {
                        tokio::task::spawn_blocking(move || discard(extra.item));
                    }
                }
                Ok(Err(e)) => {
                    built::<T>(shelves(&state.pool), &name, None);
                    tracing::warn!(profile = %name, error = %e, "{doing} failed; retrying later");
                    backoff(&state).await;
                }
                Err(e) => {
                    built::<T>(shelves(&state.pool), &name, None);
                    tracing::warn!(profile = %name, error = %e, "{doing} panicked");
                    backoff(&state).await;
                }
            }
        }
        tokio::select! {
            _ = wake.notified() => {}
            _ = state.shutdown.cancelled() => return,
        }
    }
}

async fn backoff(state: &Shared) {
    tokio::select! {
        _ = tokio::time::sleep(BACKOFF) => {}
        _ = state.shutdown.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_refill_waits_for_the_requests_in_flight_and_no_longer_than_its_bound() {
        let pool = Arc::new(Pool::default());
        // Nothing in flight: at once.
        let start = tokio::time::Instant::now();
        pool.quiet().await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        // A request that ends 30 ms from now: until then, give or take one look.
        pool.serving.fetch_add(1, Ordering::Relaxed);
        let ends = pool.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            ends.serving.fetch_sub(1, Ordering::Relaxed);
        });
        let start = tokio::time::Instant::now();
        pool.quiet().await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(30) && waited <= Duration::from_millis(30) + DEFER_STEP,
            "{waited:?}"
        );
        // A request that does not end: the bound.
        pool.serving.fetch_add(1, Ordering::Relaxed);
        let start = tokio::time::Instant::now();
        pool.quiet().await;
        let waited = start.elapsed();
        assert!(
            waited >= MAX_DEFER && waited <= MAX_DEFER + DEFER_STEP,
            "{waited:?}"
        );
    }
}
