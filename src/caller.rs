//! Who invoked codecage, for front ends that act on a caller's behalf. The CLI is for the
//! host's administrators (root). Run through sudo by another user, it acts for that user:
//! it reads that user's files with that user's credentials, and refuses what only an
//! administrator may choose (profile files, image directories). See README, "Trust model".

use std::ffi::CString;
use std::path::Path;

/// The user a root process acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Caller {
    /// The user who ran `sudo codecage ...` (SUDO_UID, SUDO_GID, SUDO_USER), unless that is
    /// root itself; None when codecage was started by root directly. The variables can only
    /// narrow what a root process does, so trusting them grants nothing.
    pub fn from_sudo() -> Option<Caller> {
        let var = |name: &str| std::env::var(name).ok();
        let uid: u32 = var("SUDO_UID")?.parse().ok()?;
        if uid == 0 {
            return None;
        }
        let gid: u32 = var("SUDO_GID").and_then(|g| g.parse().ok()).unwrap_or(uid);
        let groups = var("SUDO_USER")
            .and_then(|user| CString::new(user).ok())
            .and_then(|user| nix::unistd::getgrouplist(&user, nix::unistd::Gid::from_raw(gid)).ok())
            .map(|gs| gs.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|| vec![gid]);
        Some(Caller { uid, gid, groups })
    }

    /// Runs `f` on a thread of its own with this user's file-system credentials.
    pub fn as_user<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let caller = self.clone();
        std::thread::spawn(move || {
            crate::sys::become_fs_user(caller.uid, caller.gid, &caller.groups)
                .map_err(|e| format!("cannot take the caller's credentials: {e}"))?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err("the thread acting for the caller panicked".into()))
    }

    /// Reads `path` with this user's file-system credentials (on a thread of its own, whose
    /// credentials change alone), so a file the user cannot read is refused as it would be
    /// to them.
    pub fn read(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        let (caller, path) = (self.clone(), path.to_path_buf());
        std::thread::spawn(move || {
            crate::sys::become_fs_user(caller.uid, caller.gid, &caller.groups)?;
            std::fs::read(path)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the reading thread panicked")))
    }
}
