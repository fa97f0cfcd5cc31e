//! Full outputs of recent calls whose text block was cut, behind
//! `codecage://outputs/KEY/stdout|stderr`; and where each client's last `process` poll
//! ended.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::server::Caller;
use crate::service::tenancy::new_id;

/// How many calls' full output is kept for `codecage://outputs/...` (the oldest go first).
pub(super) const KEPT_OUTPUTS: usize = 16;
/// How many (client, session, process) poll cursors are kept (the least recently used go
/// first; a client that lost its cursor gives it back with `cursor`).
pub(super) const KEPT_CURSORS: usize = 4096;

/// Full outputs of recent calls, for resource links when the text block was cut. Each is
/// its caller's, as a session is: to anyone else its key is unknown.
#[derive(Default)]
pub struct McpStore {
    outputs: Mutex<VecDeque<Kept>>,
    cursors: Mutex<Cursors>,
}

/// The byte offsets (stdout, stderr) each client's polls reached, by (owner, session,
/// process), with when each was last used.
#[derive(Default)]
struct Cursors {
    map: HashMap<CursorKey, ((u64, u64), u64)>,
    clock: u64,
}

/// (owner, session, process).
type CursorKey = (String, String, u64);

struct Kept {
    key: String,
    owner: String,
    stdout: String,
    stderr: String,
}

impl McpStore {
    /// Keeps a call's output for `caller`, under a new key from the OS's CSPRNG (None:
    /// without randomness there is no key, and the output is not kept).
    pub(super) fn keep(&self, caller: &Caller, stdout: String, stderr: String) -> Option<String> {
        let key = new_id().ok()?;
        let mut outputs = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
        if outputs.len() >= KEPT_OUTPUTS {
            outputs.pop_front();
        }
        outputs.push_back(Kept {
            key: key.clone(),
            owner: caller.owner(),
            stdout,
            stderr,
        });
        Some(key)
    }

    /// Where `caller`'s last poll of process `process` of session `session` ended ((0, 0):
    /// none yet).
    pub(super) fn cursor(&self, caller: &Caller, session: &str, process: u64) -> (u64, u64) {
        let cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
        cursors
            .map
            .get(&(caller.owner(), session.to_string(), process))
            .map_or((0, 0), |(c, _)| *c)
    }

    /// Records where `caller`'s poll of the process ended.
    pub(super) fn set_cursor(
        &self,
        caller: &Caller,
        session: &str,
        process: u64,
        cursor: (u64, u64),
    ) {
        let mut cursors = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
        cursors.clock += 1;
        let now = cursors.clock;
        let key = (caller.owner(), session.to_string(), process);
        if cursors.map.len() >= KEPT_CURSORS && !cursors.map.contains_key(&key) {
            let oldest = cursors
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                cursors.map.remove(&oldest);
            }
        }
        cursors.map.insert(key, (cursor, now));
    }

    /// A kept stream, if `caller` may see it (its owner, or an admin).
    pub(super) fn get(&self, caller: &Caller, key: &str, stream: &str) -> Option<String> {
        let outputs = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
        let kept = outputs
            .iter()
            .find(|k| k.key == key && caller.may_use(&k.owner))?;
        match stream {
            "stdout" => Some(kept.stdout.clone()),
            "stderr" => Some(kept.stderr.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::config::Role;

    #[test]
    fn a_kept_output_is_its_callers_and_an_admins_only() {
        let store = McpStore::default();
        let token = |name: &str, role| Caller::Token {
            name: name.into(),
            role,
        };
        let (one, two) = (token("one", Role::User), token("two", Role::User));
        let key = store.keep(&one, "out".into(), "err".into()).unwrap();
        assert_eq!(key.len(), 32);
        assert_eq!(store.get(&one, &key, "stdout").as_deref(), Some("out"));
        assert_eq!(store.get(&one, &key, "stderr").as_deref(), Some("err"));
        assert_eq!(store.get(&two, &key, "stdout"), None);
        let admin = token("root", Role::Admin);
        assert_eq!(store.get(&admin, &key, "stdout").as_deref(), Some("out"));
        for _ in 0..KEPT_OUTPUTS {
            store.keep(&one, String::new(), String::new()).unwrap();
        }
        assert_eq!(store.get(&one, &key, "stdout"), None, "the oldest go first");
    }

    #[test]
    fn poll_cursors_are_each_clients_and_bounded() {
        let store = McpStore::default();
        let token = |name: &str| Caller::Token {
            name: name.into(),
            role: Role::User,
        };
        let (one, two) = (token("one"), token("two"));
        assert_eq!(store.cursor(&one, "s", 1), (0, 0));
        store.set_cursor(&one, "s", 1, (10, 2));
        assert_eq!(store.cursor(&one, "s", 1), (10, 2));
        assert_eq!(store.cursor(&two, "s", 1), (0, 0));
        assert_eq!(store.cursor(&one, "s", 2), (0, 0));
        for i in 0..KEPT_CURSORS as u64 {
            store.set_cursor(&two, "t", i, (i, 0));
        }
        assert_eq!(
            store.cursor(&one, "s", 1),
            (0, 0),
            "the least recently used go"
        );
        assert_eq!(store.cursor(&two, "t", 5), (5, 0));
    }
}
