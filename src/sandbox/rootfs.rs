//! What the `host` rootfs holds: which host paths are bound read-only, and the small /etc
//! that is written instead of the host's (no shadow, no host users, no keys or configs).

use crate::spec::{SANDBOX_UID, SANDBOX_USER};

/// Top-level host directories bound read-only (or recreated as symlinks on merged-/usr
/// systems, where /bin -> usr/bin).
pub const HOST_TOP: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Entries of the host's /etc that programs need and that hold no secrets, bound read-only
/// when they exist. A trailing `*` matches a prefix.
/// - `alternatives`: Debian's /usr/bin/awk, nodejs and friends are symlinks through it.
/// - `ld.so.*`: the dynamic loader's cache and search path.
/// - `localtime`, `timezone`: local time in logs and `date`.
/// - `ssl/certs`, `ca-certificates*`: public CA certificates only (not `ssl/private`).
/// - `python3*`: Debian's sitecustomize for the system Python.
/// - the rest: the data files libc and shells read (protocols, services, mime types, ...).
pub const HOST_ETC: &[&str] = &[
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "ssl/certs",
    "ca-certificates",
    "ca-certificates.conf",
    "python3*",
    "protocols",
    "services",
    "mime.types",
    "magic",
    "magic.mime",
    "bash.bashrc",
    "inputrc",
    "debian_version",
    "os-release",
    "gai.conf",
    "host.conf",
];

/// The files written into the sandbox's /etc: (name, content).
pub fn synthesized_etc(hostname: &str) -> Vec<(&'static str, String)> {
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
        ("nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files\nnetworks: files\nprotocols: files\nservices: files\n".into()),
        // No network, so no name servers; an empty file keeps resolvers from guessing.
        ("resolv.conf", String::new()),
        ("shells", "/bin/sh\n/bin/bash\n/usr/bin/sh\n/usr/bin/bash\n".into()),
    ]
}

/// Expands `HOST_ETC` against the names present in the host's /etc.
pub fn host_etc_entries(present: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for pattern in HOST_ETC {
        if let Some(prefix) = pattern.strip_suffix('*') {
            let mut matched: Vec<_> = present
                .iter()
                .filter(|n| n.starts_with(prefix))
                .cloned()
                .collect();
            matched.sort();
            out.extend(matched);
        } else if pattern.contains('/') || present.iter().any(|n| n == pattern) {
            out.push((*pattern).to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etc_has_the_sandbox_user_and_no_host_secrets() {
        let files = synthesized_etc("sandbox");
        let passwd = &files.iter().find(|(n, _)| *n == "passwd").unwrap().1;
        assert!(passwd.contains("sandbox:x:1000:1000"));
        let names: Vec<_> = files.iter().map(|(n, _)| *n).collect();
        for secret in ["shadow", "gshadow", "sudoers", "ssh"] {
            assert!(!names.contains(&secret));
            assert!(!HOST_ETC.iter().any(|e| e.starts_with(secret)));
        }
        assert!(!HOST_ETC.contains(&"ssl"), "ssl/private must stay out");
    }

    #[test]
    fn prefix_patterns_expand() {
        let present: Vec<String> = ["python3", "python3.11", "passwd", "alternatives"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let got = host_etc_entries(&present);
        assert!(got.contains(&"python3".into()) && got.contains(&"python3.11".into()));
        assert!(got.contains(&"alternatives".into()));
        assert!(!got.contains(&"passwd".into()));
        assert!(!got.contains(&"ld.so.cache".into()));
    }
}
