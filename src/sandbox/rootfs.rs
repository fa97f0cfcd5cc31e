//! What the `host` rootfs holds: which host paths are bound read-only, and the small /etc
//! that is written instead of the host's (no shadow, no host users, no keys or configs).

use crate::spec::{SANDBOX_UID, SANDBOX_USER};

/// Top-level host directories bound read-only (or recreated as symlinks on merged-/usr
/// systems, where /bin -> usr/bin).
pub const HOST_TOP: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Entries of the host's /etc that programs need and that hold no secrets, bound read-only
/// when they exist. Kept short: each costs a bind mount (~35 us) at every start.
/// - `alternatives`: Debian's /usr/bin/awk, nodejs and friends are symlinks through it.
/// - `ld.so.cache`: the dynamic loader's cache (ld.so.conf is only read by ldconfig).
/// - `localtime`: local time in logs and `date` (a symlink into /usr/share/zoneinfo).
/// - `ssl/certs`: public CA certificates only (not `ssl/private`).
/// - `python3`, `python3.N`: Debian's sitecustomize for the system Python.
/// - `protocols`, `services`, `mime.types`: the data files libc and Python read.
/// - `os-release`: what programs print about the system.
pub const HOST_ETC: &[&str] = &[
    "alternatives",
    "ld.so.cache",
    "localtime",
    "ssl/certs",
    "python3",
    "python3.9",
    "python3.10",
    "python3.11",
    "python3.12",
    "python3.13",
    "python3.14",
    "protocols",
    "services",
    "mime.types",
    "os-release",
];

/// The sandbox's resolv.conf: with a gateway, its DNS server; without, none (an empty file
/// keeps resolvers from guessing).
pub fn resolv_conf(gateway: bool) -> String {
    match gateway {
        true => format!("nameserver {}\n", crate::network::GATEWAY_ADDR),
        false => String::new(),
    }
}

/// The files written into the sandbox's /etc: (name, content). With a gateway, names are
/// looked up in DNS too.
pub fn synthesized_etc(hostname: &str, gateway: bool) -> Vec<(&'static str, String)> {
    let hosts = if gateway { "files dns" } else { "files" };
    let uid = SANDBOX_UID;
    let user = SANDBOX_USER;
    vec![
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                 {user}:x:{uid}:{uid}:{user}:/work:/bin/bash\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        ("group", format!("root:x:0:\n{user}:x:{uid}:\nnogroup:x:65534:\n")),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback {hostname}\n"),
        ),
        ("hostname", format!("{hostname}\n")),
        ("nsswitch.conf", format!("passwd: files\ngroup: files\nshadow: files\nhosts: {hosts}\nnetworks: files\nprotocols: files\nservices: files\n")),
        ("resolv.conf", resolv_conf(gateway)),
        ("shells", "/bin/sh\n/bin/bash\n/usr/bin/sh\n/usr/bin/bash\n".into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etc_has_the_sandbox_user_and_no_host_secrets() {
        let files = synthesized_etc("sandbox", false);
        let passwd = &files.iter().find(|(n, _)| *n == "passwd").unwrap().1;
        assert!(passwd.contains("sandbox:x:1000:1000"));
        let names: Vec<_> = files.iter().map(|(n, _)| *n).collect();
        for secret in ["shadow", "gshadow", "sudoers", "ssh"] {
            assert!(!names.contains(&secret));
            assert!(!HOST_ETC.iter().any(|e| e.starts_with(secret)));
        }
        assert!(!HOST_ETC.contains(&"ssl"), "ssl/private must stay out");
    }
}
