//! Full outputs of recent calls whose text block was cut, behind
//! `codecage://outputs/KEY/stdout|stderr`.

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::server::Caller;
use crate::service::tenancy::new_id;

/// How many calls' full output is kept for `codecage://outputs/...` (the oldest go first).
pub(super) const KEPT_OUTPUTS: usize = 16;

/// Full outputs of recent calls, for resource links when the text block was cut. Each is
/// its caller's, as a session is: to anyone else its key is unknown.
#[derive(Default)]
pub struct McpStore {
    outputs: Mutex<VecDeque<Kept>>,
}

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
}
