//! The gateway's npm registry, under /npm/ of its port 80 (npm_config_registry points
//! there): the packument of a package the profile lists (`npm_packages`) is fetched from the
//! registry the host is configured with (`npm_registry`), and every version's
//! `dist.tarball` is rewritten to go through the gateway: to the registry's own path
//! (`/npm/NAME/-/BASENAME-VERSION.tgz`, served for an allowed name only, fetched from that
//! path of the registry) when the tarball is there, else to a numbered link of this
//! sandbox's gateway, served only because an allowed packument linked to it. Anything
//! else is a 404 that says why.

use std::collections::BTreeSet;

use codecage::network::Verdict;
use hyper::StatusCode;

use super::packages::{file_name, text, Body, Links, Upstream};
use hyper::Response;

/// The most a packument may be. The gateway always asks for the abbreviated form npm
/// installs from (a few MiB for the busiest packages; the full documents run to tens of
/// MiB and are never asked for, whatever the sandbox's request says).
const MAX_PACKUMENT: usize = 32 << 20;
/// What the gateway asks the registry for: the abbreviated packument, which is all an
/// install needs.
const ACCEPT: &str = "application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8";

pub struct Registry {
    allowed: BTreeSet<String>,
    upstream: Upstream,
    tarballs: Links,
}

/// The package a registry path names: `NAME`, `@SCOPE/NAME` or `@SCOPE%2fNAME`, with no
/// further segment. npm names are lowercase: compared as they are.
pub fn package_of(path: &str) -> Option<String> {
    if path.len() > super::packages::MAX_NAME + 4 {
        return None;
    }
    let decoded = path.replace("%2f", "/").replace("%2F", "/");
    let decoded = decoded.strip_suffix('/').unwrap_or(&decoded);
    let segments: Vec<&str> = decoded.split('/').collect();
    let ok = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.~".contains(c))
    };
    match segments.as_slice() {
        [name] if ok(name) => Some(name.to_string()),
        [scope, name] if scope.starts_with('@') && ok(&scope[1..]) && ok(name) => {
            Some(format!("{scope}/{name}"))
        }
        _ => None,
    }
}

impl Registry {
    pub fn new(packages: &[String], upstream: Upstream) -> Registry {
        Registry {
            allowed: packages.iter().cloned().collect(),
            upstream,
            tarballs: Links::default(),
        }
    }

    /// A request for /npm/`path`.
    pub async fn handle(&self, path: &str) -> Response<Body> {
        if let Some(rest) = path.strip_prefix("-/tarballs/") {
            return self.tarball(rest).await;
        }
        if let Some((package, file)) = path.split_once("/-/") {
            return self.tarball_by_name(package, file).await;
        }
        let Some(name) = package_of(path) else {
            return text(
                StatusCode::NOT_FOUND,
                format!(
                    "codecage's npm registry serves the packuments of the profile's npm_packages (GET /npm/NAME) and \
                     the tarballs they link to, nothing else (not /npm/{path})\n"
                ),
            );
        };
        if !self.allowed.contains(&name) {
            return self.not_allowed(&name);
        }
        self.packument(&name).await
    }

    /// The 404 of a package not in the profile's list, logged as denied.
    fn not_allowed(&self, name: &str) -> Response<Body> {
        let reason = format!(
            "the npm package {name} is not in the profile's npm_packages: codecage's registry answers 404"
        );
        self.upstream
            .log
            .record("npm", name, 80, Verdict::Denied, Some(reason.clone()));
        json_error(StatusCode::NOT_FOUND, &reason)
    }

    async fn packument(&self, name: &str) -> Response<Body> {
        // The registry's form: a scoped name's slash escaped.
        let url = match self.upstream.base.join(&name.replace('/', "%2f")) {
            Ok(url) => url,
            Err(e) => return self.upstream.failed("npm", name, e),
        };
        let body = match self.upstream.page(&url, ACCEPT, MAX_PACKUMENT).await {
            Ok(body) => body,
            Err(e) => return self.upstream.failed("npm", name, e),
        };
        let mut doc: serde_json::Value = match serde_json::from_slice(&body) {
            Ok(doc) => doc,
            Err(e) => {
                return self
                    .upstream
                    .failed("npm", name, format!("{url}: not a packument: {e}"))
            }
        };
        self.rewrite(name, &mut doc, &url.to_string());
        self.upstream
            .log
            .record("npm", name, 80, Verdict::Allowed, None)
            .inn
            .fetch_add(body.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut response = text(StatusCode::OK, doc.to_string());
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        response
    }

    /// Every version's `dist.tarball` becomes a numbered link of the gateway's own; a
    /// version whose tarball is not an http(s) URL loses it.
    fn rewrite(&self, name: &str, doc: &mut serde_json::Value, base: &str) {
        let Some(versions) = doc.get_mut("versions").and_then(|v| v.as_object_mut()) else {
            return;
        };
        for version in versions.values_mut() {
            let Some(dist) = version.get_mut("dist").and_then(|d| d.as_object_mut()) else {
                continue;
            };
            let link = dist
                .get("tarball")
                .and_then(|t| t.as_str())
                .and_then(|t| super::client::Url::parse(&super::packages::join(base, t)).ok())
                .and_then(|url| self.link(name, url));
            match link {
                Some(link) => drop(dist.insert("tarball".into(), link.into())),
                None => drop(dist.remove("tarball")),
            }
        }
    }

    /// A tarball at the registry's own path for it, `NAME/-/BASENAME-VERSION.tgz`: what a
    /// lockfile's `resolved` URL becomes when npm points registry.npmjs.org's URLs at the
    /// configured registry (`replace-registry-host`). Served for an allowed name only, and
    /// fetched from that path of the configured registry, which holds only that package's
    /// tarballs there.
    async fn tarball_by_name(&self, package: &str, file: &str) -> Response<Body> {
        let Some(name) = package_of(package) else {
            return json_error(StatusCode::NOT_FOUND, "not a package's tarball path");
        };
        if !self.allowed.contains(&name) {
            return self.not_allowed(&name);
        }
        if tarball_version(&name, file).is_none() {
            let base = name.rsplit('/').next().unwrap_or_default();
            return json_error(
                StatusCode::NOT_FOUND,
                &format!("{file} is not a tarball of {name} ({base}-VERSION.tgz)"),
            );
        }
        match self.upstream.base.join(&format!("{name}/-/{file}")) {
            Ok(url) => self.upstream.file("npm", &name, &url).await,
            Err(e) => self.upstream.failed("npm", &name, e),
        }
    }

    /// The gateway's link for a tarball of `name` at `url`: the registry's own path when the
    /// tarball is there (the same in every sandbox, so a lockfile written in one works in
    /// the next), else a numbered link (this sandbox's only).
    fn link(&self, name: &str, url: super::client::Url) -> Option<String> {
        let file = file_name(&url);
        let gateway = codecage::network::GATEWAY_ADDR;
        let standard = tarball_version(name, &file).is_some()
            && self
                .upstream
                .base
                .join(&format!("{name}/-/{file}"))
                .is_ok_and(|own| own == url);
        if standard {
            return Some(format!("http://{gateway}/npm/{name}/-/{file}"));
        }
        let n = self.tarballs.add(name, url)?;
        Some(format!("http://{gateway}/npm/-/tarballs/{n}/{file}"))
    }

    async fn tarball(&self, rest: &str) -> Response<Body> {
        let found = rest.split_once('/').and_then(|(n, asked)| {
            let (package, url) = self.tarballs.get(n)?;
            (file_name(&url) == asked).then_some((package, url))
        });
        let Some((package, url)) = found else {
            return json_error(
                StatusCode::NOT_FOUND,
                "codecage's npm registry serves only the tarballs its packuments link to",
            );
        };
        self.upstream.file("npm", &package, &url).await
    }
}

/// The version in `file` if it is a tarball of `name` as registries name them:
/// `BASENAME-VERSION.tgz`, BASENAME the name without its scope.
fn tarball_version<'a>(name: &str, file: &'a str) -> Option<&'a str> {
    let base = name.rsplit('/').next().unwrap_or_default();
    file.strip_suffix(".tgz")
        .and_then(|f| f.strip_prefix(base))
        .and_then(|f| f.strip_prefix('-'))
        .filter(|v| {
            !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c))
        })
}

/// npm shows a registry's `error` field.
fn json_error(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = text(status, serde_json::json!({ "error": message }).to_string());
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tarball_names_carry_the_unscoped_name_and_a_version() {
        assert_eq!(
            tarball_version("left-pad", "left-pad-1.3.0.tgz"),
            Some("1.3.0")
        );
        assert_eq!(
            tarball_version("@types/node", "node-20.1.0-rc.1.tgz"),
            Some("20.1.0-rc.1")
        );
        assert_eq!(tarball_version("left-pad", "right-pad-1.0.0.tgz"), None);
        assert_eq!(tarball_version("left-pad", "left-pad-.tgz"), None);
        assert_eq!(tarball_version("left-pad", "left-pad-1.0.0.tar"), None);
        assert_eq!(tarball_version("left-pad", "left-pad-1/../x.tgz"), None);
    }

    #[test]
    fn registry_paths_name_plain_and_scoped_packages() {
        assert_eq!(package_of("left-pad").as_deref(), Some("left-pad"));
        assert_eq!(package_of("@types%2fnode").as_deref(), Some("@types/node"));
        assert_eq!(package_of("@types%2Fnode").as_deref(), Some("@types/node"));
        assert_eq!(package_of("@types/node").as_deref(), Some("@types/node"));
        for bad in [
            "",
            "..",
            "a/b",
            "left-pad/1.0.0",
            "@s/n/x",
            "a%20b",
            "-/v1/search",
        ] {
            assert_eq!(package_of(bad), None, "{bad}");
        }
    }
}
