//! What the gateway did, for `Outcome.network`: one entry per destination and verdict,
//! with a count and the bytes each way (updated live by the connections that belong to it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use codecage::network::{Connection, Verdict};

/// The most distinct entries a run reports; the rest are counted in one more.
pub const MAX_ENTRIES: usize = 256;

/// The longest host an entry keeps (a DNS name's own limit), and the longest reason.
const MAX_HOST: usize = 253;
const MAX_REASON: usize = 1024;

/// `s` cut to at most `max` bytes, at a character's boundary, marked with `…` when cut.
fn cut(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match codecage::units::head(s, max) {
        whole if whole.len() == s.len() => s.into(),
        head => format!("{head}…").into(),
    }
}

#[derive(Default)]
pub struct Bytes {
    pub out: AtomicU64,
    pub inn: AtomicU64,
}

struct Entry {
    protocol: &'static str,
    host: String,
    port: u16,
    verdict: Verdict,
    reason: Option<String>,
    count: u64,
    bytes: Arc<Bytes>,
}

#[derive(Default)]
pub struct Log {
    entries: Mutex<Vec<Entry>>,
}

impl Log {
    /// Counts one connection (or question) and returns the counters its bytes go to.
    pub fn record(
        &self,
        protocol: &'static str,
        host: &str,
        port: u16,
        verdict: Verdict,
        reason: Option<String>,
    ) -> Arc<Bytes> {
        // What the payload chose (a name it asked for, a path) is cut to a bound, so the
        // outcome and the audit record stay small whatever it asks.
        let host = cut(host, MAX_HOST);
        let reason = reason.map(|r| cut(&r, MAX_REASON).to_string());
        let Ok(mut entries) = self.entries.lock() else {
            return Arc::default();
        };
        let same = |e: &Entry| {
            e.protocol == protocol
                && e.host == host
                && e.port == port
                && e.verdict == verdict
                && e.reason == reason
        };
        if let Some(e) = entries.iter_mut().find(|e| same(e)) {
            e.count += 1;
            return e.bytes.clone();
        }
        let (host, reason) = if entries.len() >= MAX_ENTRIES {
            let over = "*";
            if let Some(e) = entries.iter_mut().find(|e| e.host == over) {
                e.count += 1;
                return e.bytes.clone();
            }
            (
                over.to_string(),
                Some(format!(
                    "more than {MAX_ENTRIES} destinations: the rest are counted here"
                )),
            )
        } else {
            (host.to_string(), reason)
        };
        let bytes = Arc::new(Bytes::default());
        entries.push(Entry {
            protocol,
            host,
            port,
            verdict,
            reason,
            count: 1,
            bytes: bytes.clone(),
        });
        bytes
    }

    /// Everything recorded since the last call. Connections still open keep counting into
    /// entries already taken, which are not reported again.
    pub fn take(&self) -> Vec<Connection> {
        let Ok(mut entries) = self.entries.lock() else {
            return Vec::new();
        };
        std::mem::take(&mut *entries)
            .into_iter()
            .map(|e| Connection {
                protocol: e.protocol.to_string(),
                host: e.host,
                port: e.port,
                verdict: e.verdict,
                reason: e.reason,
                count: e.count,
                bytes_out: e.bytes.out.load(Ordering::Relaxed),
                bytes_in: e.bytes.inn.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_payload_chose_is_cut_to_a_bound() {
        let log = Log::default();
        let long = "a".repeat(60_000);
        log.record(
            "npm",
            &long,
            80,
            Verdict::Denied,
            Some(format!("{long} is not allowed")),
        );
        let taken = log.take();
        assert_eq!(taken[0].host.len(), MAX_HOST + '…'.len_utf8());
        assert!(taken[0].reason.as_ref().unwrap().len() <= MAX_REASON + 3);
        assert_eq!(cut("é", 1), "…");
        assert_eq!(cut("short", 10), "short");
    }
}
