//! Every request a sandbox sends on a plain-HTTP connection, checked before it goes on.
//!
//! The gateway reads the stream the sandbox sends as HTTP/1.1 does (RFC 9112): a request
//! head, then its body framed by Content-Length or chunked coding, then the next head.
//! Each head must be in the one form every server reads the same way, and name the host
//! the program resolved; a head that is not is refused, and nothing from it on is sent.
//! Responses are not read: a request cannot change how the requests after it are framed,
//! except by a protocol upgrade, which is refused (TLS carries WebSockets: wss://).
//!
//! The one form: CRLF line ends only (no bare LF or CR), no NUL, no obs-fold (a line that
//! starts with a space or tab), a request line of exactly `METHOD SP TARGET SP HTTP/1.x`
//! with an origin-form target (`/path`; `*` for OPTIONS), exactly one Host header, at most
//! one Content-Length (digits) or Transfer-Encoding `chunked` (HTTP/1.1 only), never both.

use codecage::network::normalize_name;

/// The longest request head (and chunk line, and trailer section) read: past it, refused.
pub const MAX_HEAD: usize = 64 * 1024;
/// The most header fields in a head.
const MAX_HEADERS: usize = 100;
/// The longest chunk-size line (with extensions).
const MAX_CHUNK_LINE: usize = 1024;

/// How the body after a head ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes (0: none).
    Length(u64),
    Chunked,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers(usize),
}

/// The requests of one connection to `name`, as its bytes arrive.
pub struct Requests {
    name: String,
    state: State,
    pending: Vec<u8>,
    /// How much of `pending` has been searched for the end of a head or trailer line (a
    /// head that comes a byte at a time is searched once, not once per byte).
    scanned: usize,
    heads: usize,
    /// Why the connection goes no further, once a request was refused.
    refused: Option<String>,
}

impl Requests {
    pub fn new(name: &str) -> Requests {
        Requests {
            name: name.to_string(),
            state: State::Head,
            pending: Vec::new(),
            scanned: 0,
            heads: 0,
            refused: None,
        }
    }

    /// Request heads checked and passed so far.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Why the connection goes no further, once a request was refused.
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// Takes bytes the sandbox sent and appends to `out` those that may go on now (the
    /// rest wait for what completes them); or says why the connection goes no further
    /// (`out` then holds what came before the refused request, which may still go on).
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        if let Some(why) = &self.refused {
            return Err(why.clone());
        }
        let fed = self.feed_inner(data, out);
        if let Err(why) = &fed {
            self.refused = Some(why.clone());
            self.pending = Vec::new();
        }
        fed
    }

    fn feed_inner(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        // A body's bytes with nothing pending go straight through.
        if let (State::Body(n) | State::ChunkData(n), true) = (self.state, self.pending.is_empty())
        {
            let k = (n.min(data.len() as u64)) as usize;
            out.extend_from_slice(&data[..k]);
            self.state = self.after_data(n - k as u64);
            self.pending.extend_from_slice(&data[k..]);
        } else {
            self.pending.extend_from_slice(data);
        }
        loop {
            match self.state {
                State::Head => {
                    let from = self.scanned.saturating_sub(3);
                    let Some(end) = find(&self.pending[from..], b"\r\n\r\n").map(|i| i + from)
                    else {
                        if self.pending.len() >= MAX_HEAD {
                            return Err(format!(
                                "an HTTP request head longer than {} KiB",
                                MAX_HEAD / 1024
                            ));
                        }
                        // Refuse a malformed line as soon as it is seen, not at the end.
                        check_lines(&self.pending, self.scanned.saturating_sub(1))?;
                        self.scanned = self.pending.len();
                        break;
                    };
                    self.scanned = 0;
                    let head = &self.pending[..end + 4];
                    let framing = check_head(head, &self.name)?;
                    out.extend_from_slice(head);
                    self.pending.drain(..end + 4);
                    self.heads += 1;
                    self.state = match framing {
                        Framing::Length(0) => State::Head,
                        Framing::Length(n) => State::Body(n),
                        Framing::Chunked => State::ChunkSize,
                    };
                }
                State::Body(n) | State::ChunkData(n) => {
                    if self.pending.is_empty() {
                        break;
                    }
                    let k = (n.min(self.pending.len() as u64)) as usize;
                    out.extend(self.pending.drain(..k));
                    self.state = self.after_data(n - k as u64);
                }
                State::ChunkSize => {
                    let Some(line_end) = find(&self.pending, b"\n") else {
                        if self.pending.len() > MAX_CHUNK_LINE {
                            return Err("a chunk-size line that does not end".into());
                        }
                        break;
                    };
                    let line = &self.pending[..=line_end];
                    if line.len() > MAX_CHUNK_LINE
                        || !line.first().is_some_and(u8::is_ascii_hexdigit)
                        || !line.ends_with(b"\r\n")
                        || line[..line.len() - 2]
                            .iter()
                            .any(|b| matches!(b, 0 | b'\r' | b'\n'))
                    {
                        return Err("a malformed chunk-size line".into());
                    }
                    let size = match httparse::parse_chunk_size(line) {
                        Ok(httparse::Status::Complete((n, size))) if n == line.len() => size,
                        _ => return Err("a malformed chunk-size line".into()),
                    };
                    out.extend(self.pending.drain(..=line_end));
                    self.state = match size {
                        0 => State::Trailers(0),
                        n => State::ChunkData(n),
                    };
                }
                State::ChunkEnd => {
                    if self.pending.len() < 2 {
                        break;
                    }
                    if &self.pending[..2] != b"\r\n" {
                        return Err("a chunk's data is not followed by CRLF".into());
                    }
                    out.extend(self.pending.drain(..2));
                    self.state = State::ChunkSize;
                }
                State::Trailers(seen) => {
                    let from = self.scanned;
                    let Some(line_end) = find(&self.pending[from..], b"\n").map(|i| i + from)
                    else {
                        if seen + self.pending.len() > MAX_HEAD {
                            return Err("a chunked body's trailer section is too long".into());
                        }
                        self.scanned = self.pending.len();
                        break;
                    };
                    self.scanned = 0;
                    let line = &self.pending[..=line_end];
                    check_lines(line, 0)?;
                    if line.len() > 2 && matches!(line[0], b' ' | b'\t') {
                        return Err("a trailer line folded onto the one before (obs-fold)".into());
                    }
                    if seen + line.len() > MAX_HEAD {
                        return Err("a chunked body's trailer section is too long".into());
                    }
                    let last = line == b"\r\n";
                    out.extend(self.pending.drain(..=line_end));
                    self.state = match last {
                        true => State::Head,
                        false => State::Trailers(seen + line_end + 1),
                    };
                }
            }
        }
        Ok(())
    }

    fn after_data(&self, left: u64) -> State {
        match (self.state, left) {
            (State::Body(_), 0) => State::Head,
            (State::Body(_), n) => State::Body(n),
            (_, 0) => State::ChunkEnd,
            (_, n) => State::ChunkData(n),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// CRLF line ends only, and no NUL, in `bytes` (a head or a part of one) from `start`.
fn check_lines(bytes: &[u8], start: usize) -> Result<(), String> {
    for (i, b) in bytes.iter().enumerate().skip(start) {
        match b {
            0 => return Err("a NUL byte in an HTTP request head".into()),
            b'\n' if i == 0 || bytes[i - 1] != b'\r' => {
                return Err(
                    "a bare LF line end in an HTTP request head (only CRLF is accepted)".into(),
                )
            }
            b'\r' if bytes.get(i + 1).is_some_and(|n| *n != b'\n') => {
                return Err("a bare CR in an HTTP request head".into())
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks one complete request head (ending with the empty line) against `name`, the name
/// the program resolved; returns how its body is framed.
pub fn check_head(head: &[u8], name: &str) -> Result<Framing, String> {
    check_lines(head, 0)?;
    if head[..head.len() - 2]
        .windows(3)
        .any(|w| w[0] == b'\r' && w[1] == b'\n' && matches!(w[2], b' ' | b'\t'))
    {
        return Err("a header line folded onto the one before (obs-fold)".into());
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        Ok(_) => return Err("an HTTP request head that does not end where it should".into()),
        Err(e) => return Err(format!("a malformed HTTP request head ({e})")),
    }
    let method = request.method.unwrap_or_default();
    let target = request.path.unwrap_or_default();
    let version = request.version.unwrap_or_default();
    if method == "CONNECT" {
        return Err("CONNECT (a tunnel through the server) is not carried".into());
    }
    let origin_form = target.starts_with('/') || (method == "OPTIONS" && target == "*");
    if !origin_form {
        return Err(format!(
            "the request target {} is not origin-form (a path): absolute-form (proxy) requests are refused",
            shorten(target)
        ));
    }
    let mut host = None;
    let mut length = None;
    let mut chunked = false;
    for h in request.headers.iter() {
        let value = std::str::from_utf8(h.value)
            .map_err(|_| format!("the {} header is not text", shorten(h.name)))?
            .trim_matches([' ', '\t']);
        match h.name.to_ascii_lowercase().as_str() {
            "host" if host.replace(value).is_some() => {
                return Err("more than one Host header".into());
            }
            "content-length" => {
                if length.is_some() {
                    return Err("more than one Content-Length header".into());
                }
                if value.is_empty() || value.len() > 18 || !value.bytes().all(|b| b.is_ascii_digit())
                {
                    return Err(format!("a Content-Length of {}", shorten(value)));
                }
                length = value.parse::<u64>().ok();
            }
            "transfer-encoding" => {
                if chunked || !value.eq_ignore_ascii_case("chunked") || version != 1 {
                    return Err(format!(
                        "a Transfer-Encoding of {} (only one, `chunked`, on HTTP/1.1)",
                        shorten(value)
                    ));
                }
                chunked = true;
            }
            "upgrade" => {
                return Err(
                    "a protocol upgrade on plain HTTP (the gateway could not check what follows; use wss:// or https://)"
                        .into(),
                )
            }
            _ => {}
        }
    }
    let Some(host) = host else {
        return Err("the HTTP request has no Host header to check".into());
    };
    if normalize_name(strip_port(host)).as_deref() != Some(name) {
        return Err(format!(
            "the HTTP Host {} differs from {name}, the name the program resolved",
            shorten(host)
        ));
    }
    match (chunked, length) {
        (true, Some(_)) => Err("both Transfer-Encoding and Content-Length".into()),
        (true, None) => Ok(Framing::Chunked),
        (false, n) => Ok(Framing::Length(n.unwrap_or(0))),
    }
}

/// `example.com:8080` -> `example.com`; a port must be digits.
fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// What the sandbox sent, cut for a reason line, control characters escaped.
fn shorten(s: &str) -> String {
    let cut: String = s.chars().take(80).collect();
    cut.escape_debug().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Requests {
        /// `feed` with its own output buffer.
        fn take(&mut self, data: &[u8]) -> Result<Vec<u8>, String> {
            let mut out = Vec::new();
            self.feed(data, &mut out).map(|()| out)
        }
    }

    fn refused(head: &str) -> String {
        check_head(head.as_bytes(), "allowed.test").unwrap_err()
    }

    #[test]
    fn a_plain_request_passes_with_its_framing() {
        let ok = |h: &str| check_head(h.as_bytes(), "allowed.test").unwrap();
        assert_eq!(
            ok("GET / HTTP/1.1\r\nHost: Allowed.Test:80\r\nAccept: */*\r\n\r\n"),
            Framing::Length(0)
        );
        assert_eq!(
            ok("POST /x?a=b HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 12\r\n\r\n"),
            Framing::Length(12)
        );
        assert_eq!(
            ok("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\nHost: allowed.test\r\n\r\n"),
            Framing::Chunked
        );
        assert_eq!(
            ok("OPTIONS * HTTP/1.0\r\nHost: allowed.test\r\n\r\n"),
            Framing::Length(0)
        );
    }

    #[test]
    fn every_ambiguous_form_is_refused_with_its_reason() {
        for (head, why) in [
            ("GET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "origin-form"),
            ("GET / HTTP/1.1\r\nX-Pad: 1\nHost: other.test\r\n\r\n", "bare LF"),
            ("GET / HTTP/1.1\nHost: allowed.test\n\n", "bare LF"),
            ("GET / HTTP/1.1\r\nHost: allowed.test\rX: y\r\n\r\n", "bare CR"),
            ("GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n", "more than one Host"),
            ("GET / HTTP/1.1\r\nHost: other.test\r\n\r\n", "differs"),
            ("GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", "no Host"),
            ("GET / HTTP/1.1\r\nX: a\r\n b\r\nHost: allowed.test\r\n\r\n", "obs-fold"),
            ("GET / HTTP/1.1\r\nHost: allowed.test\r\n\tX: b\r\n\r\n", "obs-fold"),
            ("GET / HTTP/1.1\r\nHost: allowed.test\0\r\n\r\n", "NUL"),
            ("GET  / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "malformed"),
            ("GET / HTTP/1.1\r\nHost : allowed.test\r\n\r\n", "malformed"),
            ("GET / HTTP/2.0\r\nHost: allowed.test\r\n\r\n", "malformed"),
            ("CONNECT other.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "CONNECT"),
            ("GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\n\r\n", "upgrade"),
            (
                "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
                "Content-Length",
            ),
            ("POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: +5\r\n\r\n", "Content-Length"),
            (
                "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
                "both",
            ),
            (
                "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                "Transfer-Encoding",
            ),
            ("POST / HTTP/1.0\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.1"),
        ] {
            let reason = refused(head);
            assert!(reason.contains(why), "{head:?}: {reason}");
        }
    }

    #[test]
    fn kept_alive_and_pipelined_requests_are_each_checked() {
        let mut r = Requests::new("allowed.test");
        let two = "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /b HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
        assert_eq!(r.take(two.as_bytes()).unwrap(), two.as_bytes());
        assert_eq!(r.heads(), 2);
        // A second request for another name, pipelined behind an allowed one: the first
        // goes on, the second is refused.
        let mut r = Requests::new("allowed.test");
        let first = "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
        let out = r.take(first.as_bytes()).unwrap();
        assert_eq!(out, first.as_bytes());
        let err = r
            .take(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
            .unwrap_err();
        assert!(err.contains("other.test"), "{err}");
        // Both in one read: the allowed one may still go on, and the refusal stays.
        let mut r = Requests::new("allowed.test");
        let mut out = Vec::new();
        let both = format!("{first}GET / HTTP/1.1\r\nHost: other.test\r\n\r\n");
        assert!(r.feed(both.as_bytes(), &mut out).is_err());
        assert_eq!(out, first.as_bytes());
        assert_eq!(r.heads(), 1);
        assert!(r.refused().unwrap().contains("other.test"));
        assert!(r.take(first.as_bytes()).is_err());
        // A head split across reads waits for its end; a bare LF is refused at once.
        let mut r = Requests::new("allowed.test");
        assert!(r.take(b"GET / HTTP/1.1\r\nHo").unwrap().is_empty());
        assert!(r.take(b"st: x\n").unwrap_err().contains("bare LF"));
    }

    #[test]
    fn bodies_are_followed_to_the_next_head() {
        // A body that looks like a request is a body (Content-Length), not a request.
        let mut r = Requests::new("allowed.test");
        let body = "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n";
        let req = format!(
            "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        // Byte by byte, as a slow sender would.
        let mut out = Vec::new();
        for b in req.as_bytes() {
            out.extend(r.take(&[*b]).unwrap());
        }
        assert_eq!(out, req.as_bytes());
        assert_eq!(r.heads(), 1);
        // ... and the request after it is checked.
        assert!(r.take(body.as_bytes()).unwrap_err().contains("other.test"));

        // Chunked, with an extension and a trailer, then the next request.
        let mut r = Requests::new("allowed.test");
        let req = "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n\
                   5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n\
                   GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
        assert_eq!(r.take(req.as_bytes()).unwrap(), req.as_bytes());
        assert_eq!(r.heads(), 2);
        // The chunk's data may hold anything; its size line may not end in a bare LF.
        let mut r = Requests::new("allowed.test");
        let head = "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n";
        r.take(head.as_bytes()).unwrap();
        assert!(r.take(b"5\nhello\r\n").unwrap_err().contains("chunk"));
        let mut r = Requests::new("allowed.test");
        r.take(head.as_bytes()).unwrap();
        assert!(r.take(b"5\r\nhelloXX").unwrap_err().contains("CRLF"));
    }

    #[test]
    fn a_head_that_never_ends_is_refused_at_the_bound() {
        let mut r = Requests::new("allowed.test");
        r.take(b"GET / HTTP/1.1\r\n").unwrap();
        let line = format!("X-Pad: {}\r\n", "a".repeat(1000));
        let mut refused = None;
        for _ in 0..100 {
            if let Err(e) = r.take(line.as_bytes()) {
                refused = Some(e);
                break;
            }
        }
        assert!(refused.expect("never refused").contains("longer than"));
    }
}
