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
    /// Supplementary groups, from the host's name service; None when they were not asked
    /// for ([`Caller::from_sudo_ids`]), and then acting as the caller is refused.
    pub groups: Option<Vec<u32>>,
}

impl Caller {
    /// The user who ran `sudo codecage ...` (SUDO_UID, SUDO_GID, SUDO_USER), unless that is
    /// root itself; None when codecage was started by root directly. The variables can only
    /// narrow what a root process does, so trusting them grants nothing. Their supplementary
    /// groups come from the host's name service (getgrouplist of SUDO_USER).
    pub fn from_sudo() -> Option<Caller> {
        let mut caller = Caller::from_sudo_ids()?;
        let groups = std::env::var("SUDO_USER")
            .ok()
            .and_then(|user| CString::new(user).ok())
            .and_then(|user| {
                nix::unistd::getgrouplist(&user, nix::unistd::Gid::from_raw(caller.gid)).ok()
            })
            .map(|gs| gs.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|| vec![caller.gid]);
        caller.groups = Some(groups);
        Some(caller)
    }

    /// The sudo caller's ids alone, without asking the name service for their groups: for a
    /// process that must not ask it (a statically linked `codecage`) and does not act as the
    /// caller (it reads and writes none of their files); [`Caller::open_dir`],
    /// [`Caller::as_user`] and [`Caller::read`] refuse.
    pub fn from_sudo_ids() -> Option<Caller> {
        let var = |name: &str| std::env::var(name).ok();
        let uid: u32 = var("SUDO_UID")?.parse().ok()?;
        if uid == 0 {
            return None;
        }
        let gid: u32 = var("SUDO_GID").and_then(|g| g.parse().ok()).unwrap_or(uid);
        Some(Caller {
            uid,
            gid,
            groups: None,
        })
    }

    /// Takes this user's file-system credentials on the calling thread.
    fn become_user(&self) -> std::io::Result<()> {
        let groups = self.groups.as_deref().ok_or_else(|| {
            std::io::Error::other(format!(
                "acting as uid {} needs their groups, which were not looked up (a statically \
                 linked codecage hands such runs to codecage-full; this one was not: a bug)",
                self.uid
            ))
        })?;
        crate::sys::become_fs_user(self.uid, self.gid, groups)
    }

    /// Opens the directory `path` (O_PATH) with this user's file-system credentials, so a
    /// directory they cannot reach is refused as it would be to them.
    pub fn open_dir(&self, path: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
        let (caller, path) = (self.clone(), path.to_path_buf());
        std::thread::spawn(move || {
            caller.become_user()?;
            open_dir(&path)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the opening thread panicked")))
    }

    /// Runs `f` on a thread of its own with this user's file-system credentials.
    pub fn as_user<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let caller = self.clone();
        std::thread::spawn(move || {
            caller
                .become_user()
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
            caller.become_user()?;
            std::fs::read(path)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the reading thread panicked")))
    }
}

/// Opens the directory `path` (O_PATH, following symlinks), for a volume.
pub fn open_dir(path: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTDIR) => std::io::Error::other("not a directory"),
            _ => e,
        })?;
    Ok(file.into())
}
