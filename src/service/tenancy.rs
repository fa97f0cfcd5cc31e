//! Who a request acts for, and what that caller may do: the owner of what it makes (a
//! token's name, or a unix peer's uid), the profiles it may name, its quotas (sessions,
//! concurrent runs) and the ceilings on the limits it may ask for. Decided here once, for
//! every front end (DESIGN.md, "Tenancy").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use codecage::knobs::{Knob, Values};
use codecage::profile::Profile;

use super::error::{Error, Kind};
use crate::server::config::{Grant, Role, ServerConfig};

/// The profiles a caller may name when its grant does not list its own: the built-in
/// language profiles (not `ci`, whose limits are for the host's own CI).
pub const DEFAULT_PROFILES: &[&str] = &["python", "node", "typescript", "bash"];

/// Who made a request, for ownership, logs and the audit log.
#[derive(Debug, Clone)]
pub enum Caller {
    /// A peer of the unix socket, by uid; its role from `[[unix_peers]]` (root: admin).
    /// Made with [`Caller::unix`].
    Unix { uid: u32, role: Role },
    /// A bearer token, by its name.
    Token { name: String, role: Role },
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Caller::Unix { uid, role } => match role {
                Role::Admin if *uid != 0 => write!(f, "uid:{uid}(admin)"),
                _ => write!(f, "uid:{uid}"),
            },
            Caller::Token { name, role } => match role {
                Role::Admin => write!(f, "token:{name}(admin)"),
                Role::User => write!(f, "token:{name}"),
            },
        }
    }
}

impl Caller {
    /// The owner of what this caller makes: `token:NAME` or `uid:N` (the role is not
    /// part of it).
    pub fn owner(&self) -> String {
        match self {
            Caller::Unix { uid, .. } => format!("uid:{uid}"),
            Caller::Token { name, .. } => format!("token:{name}"),
        }
    }

    /// An admin token, or root on the unix socket: sees and manages every session.
    pub fn is_admin(&self) -> bool {
        match self {
            Caller::Unix { role, .. } | Caller::Token { role, .. } => *role == Role::Admin,
        }
    }

    /// Whether this caller may see and use what `owner` made.
    pub fn may_use(&self, owner: &str) -> bool {
        self.is_admin() || self.owner() == owner
    }

    /// The unix peer `uid`: root is an admin; another uid has the role its
    /// `[[unix_peers]]` entry gives, else a user's.
    pub fn unix(uid: u32, config: &ServerConfig) -> Caller {
        let role = if uid == 0 {
            Role::Admin
        } else {
            config
                .unix_peers
                .iter()
                .find(|p| p.uid == uid)
                .map_or(Role::User, |p| p.grant.role)
        };
        Caller::Unix { uid, role }
    }

    /// What the config grants this caller: its token's entry, its uid's `[[unix_peers]]`
    /// entry, else `[unix_peers_default]` for a unix peer (None: a token no longer in the
    /// config).
    fn grant<'a>(&self, config: &'a ServerConfig) -> Option<&'a Grant> {
        match self {
            Caller::Token { name, .. } => config
                .tokens
                .iter()
                .find(|t| &t.name == name)
                .map(|t| &t.grant),
            Caller::Unix { uid, .. } => Some(
                config
                    .unix_peers
                    .iter()
                    .find(|p| p.uid == *uid)
                    .map_or(&config.unix_peers_default.0, |p| &p.grant),
            ),
        }
    }

    /// The profile named is one this caller may use: its grant's `profiles`, else the
    /// built-in language profiles; an admin may use any. 403 otherwise.
    pub fn check_profile(&self, config: &ServerConfig, name: &str) -> Result<(), Error> {
        if self.is_admin() {
            return Ok(());
        }
        let listed = self.grant(config).and_then(|g| g.profiles.as_ref());
        let allowed: Vec<&str> = match listed {
            Some(list) => list.iter().map(String::as_str).collect(),
            None => DEFAULT_PROFILES.to_vec(),
        };
        if allowed.contains(&name) {
            return Ok(());
        }
        Err(Error::new(
            Kind::Policy,
            format!(
                "profile {name:?} is not one this caller may use; it may use {}",
                allowed.join(", ")
            ),
        ))
    }

    /// The request's limits within the grant's ceilings: a limit asked above a ceiling is
    /// refused (403); one not asked whose profile default is above the ceiling is lowered
    /// to it (a ceiling tightens, never loosens).
    pub fn within_ceilings(
        &self,
        config: &ServerConfig,
        profile: &Profile,
        knobs: &mut Values,
    ) -> Result<(), Error> {
        if self.is_admin() {
            return Ok(());
        }
        let Some(grant) = self.grant(config) else {
            return Ok(());
        };
        for (knob, ceiling) in grant.ceilings() {
            match knobs.get(&knob) {
                Some(asked) if *asked > ceiling => {
                    return Err(Error::new(
                        Kind::Policy,
                        format!(
                            "{} = {} is more than this caller may ask for (at most {})",
                            knob.key(),
                            knob.show(*asked),
                            knob.show(ceiling)
                        ),
                    ))
                }
                Some(_) => {}
                None if profile.value(knob) > ceiling => {
                    knobs.insert(knob, ceiling);
                }
                None => {}
            }
        }
        Ok(())
    }

    /// The ceiling on `knob` for this caller (None: only the profile's maximum).
    pub fn ceiling(&self, config: &ServerConfig, knob: Knob) -> Option<u64> {
        if self.is_admin() {
            return None;
        }
        self.grant(config)?
            .ceilings()
            .into_iter()
            .find(|(k, _)| *k == knob)
            .map(|(_, v)| v)
    }

    /// The most sessions this caller may hold at once (None: only the server's cap).
    pub fn max_sessions(&self, config: &ServerConfig) -> Option<usize> {
        (!self.is_admin())
            .then(|| self.grant(config).and_then(|g| g.max_sessions))
            .flatten()
    }

    /// The most runs and calls this caller may have running at once.
    fn max_concurrent_runs(&self, config: &ServerConfig) -> Option<usize> {
        (!self.is_admin())
            .then(|| self.grant(config).and_then(|g| g.max_concurrent_runs))
            .flatten()
    }
}

/// Each owner's runs and calls in flight, against its `max_concurrent_runs`.
#[derive(Default, Clone)]
pub struct RunCounts {
    running: Arc<Mutex<HashMap<String, usize>>>,
}

/// One run or call counted against its owner until dropped.
pub struct RunTicket {
    counts: RunCounts,
    owner: String,
}

impl RunCounts {
    /// A ticket for one more run of `caller`, or 429 (with Retry-After) past its quota.
    pub fn admit(&self, caller: &Caller, config: &ServerConfig) -> Result<RunTicket, Error> {
        let owner = caller.owner();
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let now = running.entry(owner.clone()).or_insert(0);
        if let Some(max) = caller.max_concurrent_runs(config) {
            if *now >= max {
                return Err(Error::new(
                    Kind::Quota,
                    format!(
                        "this caller already has {now} runs or calls running, its limit (max_concurrent_runs = {max}); wait for one to end"
                    ),
                )
                .retry_after(1));
            }
        }
        *now += 1;
        Ok(RunTicket {
            counts: self.clone(),
            owner,
        })
    }
}

impl Drop for RunTicket {
    fn drop(&mut self) {
        let mut running = self
            .counts
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = running.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                running.remove(&self.owner);
            }
        }
    }
}

/// A session id: 128 bits from the OS's CSPRNG. Fails closed: without randomness there
/// is no id, and no session.
pub fn new_id() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| {
        Error::new(
            Kind::Setup,
            format!("the system's random number generator failed ({e}); no session id can be made"),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> ServerConfig {
        let c: ServerConfig = toml::from_str(text).unwrap();
        c.validate().unwrap();
        c
    }

    #[test]
    fn a_token_uses_its_profiles_the_default_ones_or_any_as_admin() {
        let c = config(
            "[[tokens]]\nname = \"a\"\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\n\
             [[tokens]]\nname = \"b\"\ntoken = \"bbbbbbbbbbbbbbbbbbbb\"\nprofiles = [\"ci\"]\n\
             [[tokens]]\nname = \"root\"\ntoken = \"cccccccccccccccccccc\"\nrole = \"admin\"\n",
        );
        let a = Caller::Token {
            name: "a".into(),
            role: Role::User,
        };
        let b = Caller::Token {
            name: "b".into(),
            role: Role::User,
        };
        let admin = Caller::Token {
            name: "root".into(),
            role: Role::Admin,
        };
        assert!(a.check_profile(&c, "python").is_ok());
        let e = a.check_profile(&c, "ci").unwrap_err();
        assert_eq!(e.kind, Kind::Policy);
        assert!(e.message.contains("python, node, typescript, bash"), "{e}");
        assert!(b.check_profile(&c, "ci").is_ok());
        assert!(b.check_profile(&c, "python").is_err());
        assert!(admin.check_profile(&c, "ci").is_ok());
        assert!(Caller::unix(0, &c).check_profile(&c, "ci").is_ok());
        assert!(Caller::unix(1000, &c).check_profile(&c, "ci").is_err());
        assert!(a.may_use("token:a") && !a.may_use("token:b") && admin.may_use("token:a"));
    }

    #[test]
    fn concurrent_runs_past_the_quota_are_429_and_tickets_give_room_back() {
        let c = config(
            "[[tokens]]\nname = \"a\"\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\nmax_concurrent_runs = 1\n",
        );
        let a = Caller::Token {
            name: "a".into(),
            role: Role::User,
        };
        let counts = RunCounts::default();
        let first = counts.admit(&a, &c).unwrap();
        let e = counts.admit(&a, &c).err().unwrap();
        assert_eq!((e.kind, e.retry_after), (Kind::Quota, Some(1)));
        // Another caller is not held to a's quota.
        assert!(counts.admit(&Caller::unix(5, &c), &c).is_ok());
        drop(first);
        assert!(counts.admit(&a, &c).is_ok());
    }

    #[test]
    fn ceilings_refuse_what_is_asked_above_them_and_lower_the_profiles_default() {
        let c = config(
            "[[tokens]]\nname = \"a\"\ntoken = \"aaaaaaaaaaaaaaaaaaaa\"\n[tokens.limits]\nmemory = \"128M\"\ntimeout = \"10s\"\n",
        );
        let a = Caller::Token {
            name: "a".into(),
            role: Role::User,
        };
        let profile = Profile::load_in("python", std::path::Path::new("/nonexistent")).unwrap();
        let mut asked = Values::new();
        asked.insert(Knob::Memory, 512 << 20);
        let e = a.within_ceilings(&c, &profile, &mut asked).unwrap_err();
        assert_eq!(e.kind, Kind::Policy);
        assert!(e.message.contains("memory"), "{e}");
        let mut asked = Values::new();
        asked.insert(Knob::Timeout, 5_000);
        a.within_ceilings(&c, &profile, &mut asked).unwrap();
        assert_eq!(asked[&Knob::Memory], 128 << 20);
        assert_eq!(asked[&Knob::Timeout], 5_000);
    }

    #[test]
    fn unix_peers_have_their_entry_or_the_default_and_root_is_admin() {
        let c = config(
            "[[unix_peers]]\nuid = 1000\nmax_sessions = 1\nmax_concurrent_runs = 2\nprofiles = [\"bash\"]\n\
             [unix_peers.limits]\nmemory = \"128M\"\n\
             [[unix_peers]]\nuid = 1001\nrole = \"admin\"\n",
        );
        let listed = Caller::unix(1000, &c);
        let unlisted = Caller::unix(2000, &c);
        let admin = Caller::unix(1001, &c);
        let root = Caller::unix(0, &c);
        assert_eq!(listed.owner(), "uid:1000");
        assert_eq!(listed.to_string(), "uid:1000");
        assert_eq!(admin.to_string(), "uid:1001(admin)");
        assert_eq!(root.to_string(), "uid:0");
        assert!(root.is_admin() && admin.is_admin() && !listed.is_admin());
        assert!(!unlisted.is_admin() && !unlisted.may_use("uid:1000"));
        // Its own list, not the default one.
        assert!(listed.check_profile(&c, "bash").is_ok());
        let e = listed.check_profile(&c, "python").unwrap_err();
        assert_eq!(e.kind, Kind::Policy);
        assert!(e.message.contains("it may use bash"), "{e}");
        assert!(listed.check_profile(&c, "ci").is_err());
        assert_eq!(listed.max_sessions(&c), Some(1));
        assert_eq!(listed.ceiling(&c, Knob::Memory), Some(128 << 20));
        // Unlisted: the built-in language profiles and the bounded default quotas.
        assert!(unlisted.check_profile(&c, "python").is_ok());
        assert!(unlisted.check_profile(&c, "ci").is_err());
        assert_eq!(unlisted.max_sessions(&c), Some(16));
        assert_eq!(unlisted.max_concurrent_runs(&c), Some(16));
        assert_eq!(unlisted.ceiling(&c, Knob::Memory), None);
        // Root and a listed admin: any profile, no quota.
        assert!(root.check_profile(&c, "ci").is_ok() && admin.check_profile(&c, "ci").is_ok());
        assert_eq!(
            (root.max_sessions(&c), admin.max_sessions(&c)),
            (None, None)
        );
        // Concurrent runs past the listed peer's quota are 429, as for a token.
        let counts = RunCounts::default();
        let _held = [
            counts.admit(&listed, &c).unwrap(),
            counts.admit(&listed, &c).unwrap(),
        ];
        let e = counts.admit(&listed, &c).err().unwrap();
        assert_eq!((e.kind, e.retry_after), (Kind::Quota, Some(1)));
        // Ceilings: above is refused, the profile's default lowered.
        let profile = Profile::load_in("bash", std::path::Path::new("/nonexistent")).unwrap();
        let mut asked = Values::new();
        asked.insert(Knob::Memory, 512 << 20);
        assert_eq!(
            listed
                .within_ceilings(&c, &profile, &mut asked)
                .unwrap_err()
                .kind,
            Kind::Policy
        );
        let mut asked = Values::new();
        listed.within_ceilings(&c, &profile, &mut asked).unwrap();
        assert_eq!(asked[&Knob::Memory], 128 << 20);
    }

    #[test]
    fn the_unlisted_peers_default_keeps_its_bounds_for_keys_not_given() {
        let c = config(
            "[unix_peers_default]\nprofiles = [\"python\"]\nmax_concurrent_runs = 3\n\
             [unix_peers_default.limits]\ntimeout = \"10s\"\n",
        );
        let unlisted = Caller::unix(4242, &c);
        assert!(unlisted.check_profile(&c, "python").is_ok());
        assert!(unlisted.check_profile(&c, "bash").is_err());
        assert_eq!(unlisted.max_sessions(&c), Some(16));
        assert_eq!(unlisted.max_concurrent_runs(&c), Some(3));
        assert_eq!(unlisted.ceiling(&c, Knob::Timeout), Some(10_000));
        // Without a config file at all, an unlisted peer is bounded too.
        let none = ServerConfig::default();
        assert_eq!(Caller::unix(4242, &none).max_sessions(&none), Some(16));
        assert!(Caller::unix(4242, &none)
            .check_profile(&none, "ci")
            .is_err());
    }

    #[test]
    fn ids_are_random_hex() {
        let (a, b) = (new_id().unwrap(), new_id().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
        assert_ne!(a, "0".repeat(32));
    }
}
