//! Full outputs of recent calls whose text block was cut, behind
//! `codecage://outputs/KEY/stdout|stderr`.

use std::collections::VecDeque;
use std::sync::Mutex;

/// How many calls' full output is kept for `codecage://outputs/...` (the oldest go first).
pub(super) const KEPT_OUTPUTS: usize = 16;

/// Full outputs of recent calls, for resource links when the text block was cut.
#[derive(Default)]
pub struct McpStore {
    outputs: Mutex<VecDeque<(String, String, String)>>,
}

impl McpStore {
    pub(super) fn keep(&self, stdout: String, stderr: String) -> String {
        let key = new_key();
        let mut outputs = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
        if outputs.len() >= KEPT_OUTPUTS {
            outputs.pop_front();
        }
        outputs.push_back((key.clone(), stdout, stderr));
        key
    }

    pub(super) fn get(&self, key: &str, stream: &str) -> Option<String> {
        let outputs = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
        let (_, out, err) = outputs.iter().find(|(k, _, _)| k == key)?;
        match stream {
            "stdout" => Some(out.clone()),
            "stderr" => Some(err.clone()),
            _ => None,
        }
    }
}

fn new_key() -> String {
    let mut bytes = [0u8; 12];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut bytes);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
