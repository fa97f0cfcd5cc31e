//! The gateway's package indexes, on its port 80: a PEP 503 index for `pip install`
//! (PIP_INDEX_URL points at /simple/) and an npm registry for `npm install`
//! (npm_config_registry points at /npm/, see `npm.rs`). Each forwards only the packages the
//! profile lists (`python_packages`, `npm_packages`) to the index the host is configured
//! with (http:// or https://, through `client`), and rewrites every file link of a page it
//! forwards to a numbered link of its own. A file is served only through such a link, so a
//! program that builds a download URL itself gets nothing here, and the indexes' hosts are
//! not in `allowed_hosts`, so it gets nothing there either.
//!
//! Where the gateway connects: the configured index's own host at whatever address it has
//! (the host's administrator chose it: an internal mirror may be private); any other host a
//! page links to, or a response redirects to, only at a public address or one in the
//! profile's `allowed_ranges`, as for the sandbox's own connections.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use codecage::network::{not_public, Cidr, Verdict};
use std::sync::atomic::Ordering;

use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use ipstack::IpStackTcpStream;

use super::admission::Held;

use super::client::{Client, Url};
use super::forward::Limits;
use super::log::Log;
use super::npm::Registry;

pub type Body = BoxBody<Bytes, hyper::Error>;

/// The most a project page may be (pages of big projects run to a few MiB).
const MAX_PAGE: usize = 16 << 20;
/// Pages and packuments one sandbox may have in flight at once: each is held whole in the
/// gateway's memory (to rewrite its links), which no cgroup of the sandbox's pays for.
const PAGES_IN_FLIGHT: usize = 4;
/// The longest package name either index takes (npm's own limit; PyPI's names are
/// shorter): a longer one is refused without being fetched or logged in full.
pub const MAX_NAME: usize = 214;
/// The most file links one sandbox's indexes remember.
const MAX_LINKS: usize = 1 << 18;

/// The indexes one sandbox sees on the gateway's port 80.
pub struct Packages {
    python: Option<Index>,
    npm: Option<Registry>,
}

impl Packages {
    pub fn new(python: Option<Index>, npm: Option<Registry>) -> Packages {
        Packages { python, npm }
    }

    /// Serves HTTP/1.1 on one connection from the sandbox.
    pub async fn serve(self: Arc<Self>, flow: &mut Held<IpStackTcpStream>) {
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let packages = self.clone();
            async move { Ok::<_, std::convert::Infallible>(packages.handle(request).await) }
        });
        // Each request's head must come within the deadline, and is at most 64 KiB: what a
        // sandbox makes the gateway hold per connection is bounded.
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(super::engine::SNIFF_TIMEOUT)
            .max_buf_size(64 * 1024)
            .serve_connection(TokioIo::new(flow), service)
            .await;
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_string();
        if request.method() != hyper::Method::GET && request.method() != hyper::Method::HEAD {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "codecage's package indexes only serve GET\n".into(),
            );
        }
        if let (Some(rest), Some(npm)) = (path.strip_prefix("/npm/"), &self.npm) {
            return npm.handle(rest).await;
        }
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (parts.as_slice(), &self.python) {
            (["simple", project], Some(index)) => index.project(project).await,
            (["files", n, name], Some(index)) => index.file(n, name).await,
            _ => text(
                StatusCode::NOT_FOUND,
                format!(
                    "codecage's package indexes serve {}\n",
                    match (&self.python, &self.npm) {
                        (Some(_), Some(_)) =>
                            "/simple/PROJECT/ for the profile's python_packages and /npm/NAME for its npm_packages",
                        (Some(_), None) => "/simple/PROJECT/ for the profile's python_packages",
                        _ => "/npm/NAME for the profile's npm_packages",
                    }
                ),
            ),
        }
    }
}

/// The configured index's URL (checked when the config was read), ending in `/`.
pub fn base_url(text: &str) -> Url {
    let mut base = Url::parse(text).unwrap_or_else(|_| Url {
        https: true,
        host: "invalid.".into(),
        port: 443,
        path: "/".into(),
    });
    if !base.path.ends_with('/') {
        base.path.push('/');
    }
    base
}

/// Where an index's requests may go (its own host anywhere, others only at public
/// addresses or in the profile's ranges), and what they count against.
pub struct Upstream {
    pub client: Arc<Client>,
    /// The configured index (ends in `/`).
    pub base: Url,
    pub ranges: Vec<Cidr>,
    /// The sandbox's bandwidth cap and idle timeout, which downloads are held to as the
    /// sandbox's own connections are.
    pub limits: Arc<Limits>,
    pub log: Arc<Log>,
    /// Pages in flight, at most [`PAGES_IN_FLIGHT`] (shared by the sandbox's indexes).
    pub pages: Arc<tokio::sync::Semaphore>,
}

/// The semaphore of a sandbox's pages in flight, shared by its indexes.
pub fn pages_in_flight() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(PAGES_IN_FLIGHT))
}

impl Upstream {
    pub fn admit(&self, url: &Url, ip: IpAddr) -> Result<(), String> {
        // The configured index itself, exactly: its scheme, host and port (a link to
        // another port of the same host is judged like any other host's).
        if url.host == self.base.host && url.port == self.base.port && url.https == self.base.https
        {
            return Ok(());
        }
        match not_public(ip) {
            Some(why) if !self.ranges.iter().any(|r| r.contains(ip)) => Err(format!(
                "{url}: {} resolves to {ip} ({why}), which the gateway does not connect to for a link of the \
                 index (a profile may admit a range with allowed_ranges)",
                url.host
            )),
            _ => Ok(()),
        }
    }

    pub async fn get(&self, url: &Url, accept: &str) -> Result<Response<Incoming>, String> {
        self.client
            .get(url, accept, &|u: &Url, ip: IpAddr| self.admit(u, ip))
            .await
    }

    /// GETs a page of at most `max` bytes with status 200, read frame by frame at the
    /// sandbox's bandwidth cap and cut off when the index sends nothing for the idle
    /// timeout; at most [`PAGES_IN_FLIGHT`] of a sandbox's pages at once.
    pub async fn page(&self, url: &Url, accept: &str, max: usize) -> Result<Bytes, String> {
        let _permit = self
            .pages
            .acquire()
            .await
            .map_err(|_| "the gateway is shutting down".to_string())?;
        let response = self.get(url, accept).await?;
        if response.status() != StatusCode::OK {
            return Err(format!("{url} answered {}", response.status()));
        }
        let mut body = response.into_body();
        let mut page = Vec::new();
        loop {
            let frame = match tokio::time::timeout(self.limits.idle, body.frame()).await {
                Ok(Some(Ok(frame))) => frame,
                Ok(None) => return Ok(Bytes::from(page)),
                Ok(Some(Err(e))) => return Err(format!("reading {url}: {e}")),
                Err(_) => {
                    return Err(format!(
                        "reading {url}: the index sent nothing for {} s",
                        self.limits.idle.as_secs()
                    ))
                }
            };
            if let Some(data) = frame.data_ref() {
                if page.len() + data.len() > max {
                    return Err(format!("reading {url}: longer than {} MiB", max >> 20));
                }
                // The page comes in under the sandbox's bandwidth cap, as files do.
                self.limits.down.spend(data.len()).await;
                page.extend_from_slice(data);
            }
        }
    }

    /// Streams the file at `url` to the sandbox, counting it under (`protocol`, `name`).
    pub async fn file(&self, protocol: &'static str, name: &str, url: &Url) -> Response<Body> {
        match self.get(url, "*/*").await {
            Ok(response) => {
                let (verdict, reason) = match response.status().is_success() {
                    true => (Verdict::Allowed, None),
                    false => (
                        Verdict::Failed,
                        Some(format!("{url} answered {}", response.status())),
                    ),
                };
                let bytes = self.log.record(protocol, name, 80, verdict, reason);
                response.map(|body| self.paced(body, bytes))
            }
            Err(e) => self.failed(protocol, name, e),
        }
    }

    /// `body` as the sandbox gets it: at the sandbox's bandwidth cap (its download bucket,
    /// shared with its connections), counted, and cut off when the index sends nothing for
    /// the idle timeout.
    fn paced(&self, body: Incoming, bytes: Arc<super::log::Bytes>) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, hyper::Error>>(2);
        let limits = self.limits.clone();
        tokio::spawn(async move {
            let mut body = body;
            loop {
                let frame = match tokio::time::timeout(limits.idle, body.frame()).await {
                    Ok(Some(frame)) => frame,
                    // The end, or the index went quiet: the sandbox sees the body end
                    // short of its length.
                    Ok(None) | Err(_) => return,
                };
                if let Ok(data) = frame.as_ref().map(|f| f.data_ref()) {
                    let n = data.map_or(0, |d| d.len());
                    limits.down.spend(n).await;
                    bytes.inn.fetch_add(n as u64, Ordering::Relaxed);
                }
                if tx.send(frame).await.is_err() {
                    return;
                }
            }
        });
        StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed()
    }

    pub fn failed(&self, protocol: &'static str, name: &str, reason: String) -> Response<Body> {
        self.log
            .record(protocol, name, 80, Verdict::Failed, Some(reason.clone()));
        text(StatusCode::BAD_GATEWAY, format!("{reason}\n"))
    }
}

/// The upstream URLs a sandbox's pages linked to, by number (each URL once).
#[derive(Default)]
pub struct Links {
    inner: Mutex<LinkTable>,
}

/// Each link's package and URL, and the number of each URL.
type LinkTable = (Vec<(String, Url)>, HashMap<String, usize>);

impl Links {
    /// The number of the link to `url`, under the package `name`.
    pub fn add(&self, name: &str, url: Url) -> Option<usize> {
        let mut inner = self.inner.lock().ok()?;
        let key = url.to_string();
        if let Some(n) = inner.1.get(&key) {
            return Some(*n);
        }
        if inner.0.len() >= MAX_LINKS {
            return None;
        }
        let n = inner.0.len();
        inner.0.push((name.to_string(), url));
        inner.1.insert(key, n);
        Some(n)
    }

    pub fn get(&self, n: &str) -> Option<(String, Url)> {
        let n: usize = n.parse().ok()?;
        self.inner.lock().ok()?.0.get(n).cloned()
    }
}

/// PEP 503: lowercase, runs of `-`, `_`, `.` as one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

pub fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *response.status_mut() = status;
    response
}

/// The last segment of a URL's path.
pub fn file_name(url: &Url) -> String {
    let path = url.path.split('?').next().unwrap_or_default();
    match path.rsplit('/').next() {
        Some(name) if !name.is_empty() => name.to_string(),
        _ => "file".to_string(),
    }
}

/// The Python index (PEP 503 simple API).
pub struct Index {
    /// PEP 503-normalized names.
    allowed: BTreeSet<String>,
    upstream: Upstream,
    files: Links,
}

impl Index {
    pub fn new(packages: &[String], upstream: Upstream) -> Index {
        Index {
            allowed: packages.iter().map(|p| normalize(p)).collect(),
            upstream,
            files: Links::default(),
        }
    }

    async fn project(&self, asked: &str) -> Response<Body> {
        if asked.len() > MAX_NAME {
            return text(
                StatusCode::NOT_FOUND,
                format!("codecage's index takes package names of at most {MAX_NAME} characters\n"),
            );
        }
        let name = normalize(asked);
        if !self.allowed.contains(&name) {
            let reason = format!(
                "the Python package {name} is not in the profile's python_packages: codecage's index answers 404"
            );
            self.upstream
                .log
                .record("pip", &name, 80, Verdict::Denied, Some(reason.clone()));
            return text(StatusCode::NOT_FOUND, format!("{reason}\n"));
        }
        let url = match self.upstream.base.join(&format!("{name}/")) {
            Ok(url) => url,
            Err(e) => return self.upstream.failed("pip", &name, e),
        };
        let page = match self.upstream.page(&url, "text/html", MAX_PAGE).await {
            Ok(page) => page,
            Err(e) => return self.upstream.failed("pip", &name, e),
        };
        self.upstream
            .log
            .record("pip", &name, 80, Verdict::Allowed, None)
            .inn
            .fetch_add(page.len() as u64, Ordering::Relaxed);
        let page = String::from_utf8_lossy(&page);
        let rewritten = self.rewrite(&name, &page, &url.to_string());
        let mut response = text(StatusCode::OK, rewritten);
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/html"),
        );
        response
    }

    /// Every `href="..."` of the page becomes a link of the gateway's own, numbered.
    fn rewrite(&self, project: &str, page: &str, base: &str) -> String {
        let mut out = String::with_capacity(page.len());
        let mut rest = page;
        while let Some(at) = rest.find("href=\"") {
            let (head, tail) = rest.split_at(at + 6);
            out.push_str(head);
            let Some(end) = tail.find('"') else {
                rest = tail;
                break;
            };
            let href = tail[..end].replace("&amp;", "&");
            let (link, fragment) = match href.split_once('#') {
                Some((l, f)) => (l.to_string(), format!("#{f}")),
                None => (href.clone(), String::new()),
            };
            match Url::parse(&join(base, &link))
                .ok()
                .and_then(|url| Some((file_name(&url), self.files.add(project, url)?)))
            {
                Some((file, n)) => out.push_str(&format!("/files/{n}/{file}{fragment}")),
                // Not an http(s) link: dropped.
                None => out.push('#'),
            }
            rest = &tail[end..];
        }
        out.push_str(rest);
        out
    }

    /// A file a page linked to, or its PEP 658 metadata (the link's URL with `.metadata`).
    async fn file(&self, n: &str, asked: &str) -> Response<Body> {
        // pip quotes the links it follows again (`+` as `%2B`): compared decoded; what is
        // fetched is the stored URL, never the request's.
        let asked = percent_decode(asked);
        let found = self.files.get(n).and_then(|(_, url)| {
            let name = percent_decode(&file_name(&url));
            if asked == name {
                Some((name, url))
            } else if asked.strip_suffix(".metadata") == Some(name.as_str()) {
                let mut url = url;
                url.path = match url.path.split_once('?') {
                    Some((p, q)) => format!("{p}.metadata?{q}"),
                    None => format!("{}.metadata", url.path),
                };
                Some((asked.to_string(), url))
            } else {
                None
            }
        });
        let Some((name, url)) = found else {
            return text(
                StatusCode::NOT_FOUND,
                "codecage's index serves only the files its project pages link to\n".into(),
            );
        };
        self.upstream.file("pip", &name, &url).await
    }
}

/// `%XX` escapes decoded (an invalid one kept as it is), for comparing names.
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Whether `href` begins with a URL scheme (`http:`, `https:`, `data:` ...).
pub fn has_scheme(href: &str) -> bool {
    match href.split_once(':') {
        Some((scheme, _)) => {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }
        None => false,
    }
}

/// `href` relative to the page at `base`.
pub fn join(base: &str, href: &str) -> String {
    if has_scheme(href) {
        return href.to_string();
    }
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    // Protocol-relative (`//host/path`): another host, in the page's scheme.
    if let Some(rest) = href.strip_prefix("//") {
        return format!("{}{rest}", &base[..scheme_end]);
    }
    let origin_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let origin = &base[..origin_end];
    if let Some(absolute) = href.strip_prefix('/') {
        return format!("{origin}/{absolute}");
    }
    // The path's segments resolve; a query is kept as it is.
    let (href, query) = match href.find('?') {
        Some(at) => href.split_at(at),
        None => (href, ""),
    };
    let dir = &base[origin_end..base.rfind('/').map_or(origin_end, |i| i.max(origin_end))];
    let mut segments: Vec<&str> = dir.split('/').filter(|s| !s.is_empty()).collect();
    for part in href.split('/') {
        match part {
            "." | "" => {}
            ".." => drop(segments.pop()),
            p => segments.push(p),
        }
    }
    let slash = match href.ends_with('/') && !segments.is_empty() {
        true => "/",
        false => "",
    };
    format!("{origin}/{}{slash}{query}", segments.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_to_other_hosts_go_only_to_public_addresses_or_the_profiles_ranges() {
        use super::super::forward::Bucket;
        let upstream = Arc::new(super::super::upstream::Upstream::new(None, None).unwrap());
        let client = Arc::new(Client::new(upstream, None));
        let ranges = vec![Cidr::parse("203.0.113.0/24").unwrap()];
        let index = Upstream {
            client,
            base: base_url("https://index.test/simple"),
            ranges,
            limits: Arc::new(Limits {
                up: Bucket::new(1 << 20),
                down: Bucket::new(1 << 20),
                idle: std::time::Duration::from_secs(1),
            }),
            log: Arc::new(Log::default()),
            pages: pages_in_flight(),
        };
        assert_eq!(index.base.path, "/simple/");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let url = |s: &str| Url::parse(s).unwrap();
        // The configured index: the administrator's choice, wherever it is.
        assert!(index
            .admit(&url("https://index.test/x"), ip("10.0.0.1"))
            .is_ok());
        // Another port or scheme of the index's host is another place.
        assert!(index
            .admit(
                &url("http://index.test:2375/containers/json"),
                ip("10.0.0.1")
            )
            .is_err());
        assert!(index
            .admit(&url("http://index.test/x"), ip("10.0.0.1"))
            .is_err());
        let files = url("https://files.test/a.whl");
        assert!(index.admit(&files, ip("93.184.215.14")).is_ok());
        assert!(index.admit(&files, ip("203.0.113.7")).is_ok());
        for refused in ["169.254.169.254", "127.0.0.1", "10.0.0.1", "198.51.100.1"] {
            let err = index.admit(&files, ip(refused)).unwrap_err();
            assert!(err.contains("allowed_ranges"), "{err}");
        }
    }

    #[test]
    fn names_normalize_as_pep_503_says() {
        assert_eq!(normalize("Foo.Bar__baz-1"), "foo-bar-baz-1");
        assert_eq!(normalize("requests"), "requests");
    }

    #[test]
    fn links_resolve_against_the_page() {
        let base = "http://index.test/simple/foo/";
        assert_eq!(
            join(base, "foo-1.whl"),
            "http://index.test/simple/foo/foo-1.whl"
        );
        assert_eq!(
            join(base, "../../packages/foo-1.whl"),
            "http://index.test/packages/foo-1.whl"
        );
        assert_eq!(join(base, "/p/foo-1.whl"), "http://index.test/p/foo-1.whl");
        assert_eq!(join(base, "../bar/"), "http://index.test/simple/bar/");
        assert_eq!(
            join(base, "https://files.test/foo-1.whl"),
            "https://files.test/foo-1.whl"
        );
        assert_eq!(
            join(base, "//files.test/foo-1.whl"),
            "http://files.test/foo-1.whl"
        );
        assert_eq!(
            join(base, "foo-1.whl?src=https://x"),
            "http://index.test/simple/foo/foo-1.whl?src=https://x"
        );
        assert!(!has_scheme("foo-1.whl?src=https://x") && has_scheme("HTTPS://x/y"));
    }

    #[test]
    fn file_names_compare_decoded() {
        assert_eq!(
            percent_decode("torch-2.1.0%2Bcpu.whl"),
            "torch-2.1.0+cpu.whl"
        );
        assert_eq!(percent_decode("a%2bb%zz%"), "a+b%zz%");
    }
}
