//! What a connection's first bytes say about where it goes: the server name of a TLS
//! ClientHello (SNI), or that it is an HTTP/1 request (whose every head `http` checks).
//! Pure functions over the bytes read so far; the caller reads more while they answer
//! `NeedMore`.

/// What the first bytes of a connection are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// Not enough bytes yet.
    NeedMore,
    /// A TLS ClientHello, with its server name if it has one.
    Tls(Option<String>),
    /// An HTTP/1 request line's start (a method and a space).
    Http,
    /// Neither (or a malformed one).
    Other,
}

/// The most a sniff reads before it gives up: a ClientHello with post-quantum key shares
/// is about 2 KiB; request headers rarely pass 8 KiB.
pub const MAX_SNIFF: usize = 64 * 1024;

pub fn sniff(buf: &[u8]) -> Sniffed {
    match buf.first() {
        None => Sniffed::NeedMore,
        Some(0x16) => tls(buf),
        Some(b) if b.is_ascii_uppercase() => http(buf),
        Some(_) => Sniffed::Other,
    }
}

/// Reassembles the handshake message from TLS records (a ClientHello may span several),
/// then reads the server_name extension.
fn tls(buf: &[u8]) -> Sniffed {
    let mut handshake = Vec::new();
    let mut pos = 0;
    loop {
        if handshake.len() >= 4 {
            let len = u32::from_be_bytes([0, handshake[1], handshake[2], handshake[3]]) as usize;
            if handshake[0] != 1 || len > MAX_SNIFF {
                return Sniffed::Other;
            }
            if handshake.len() >= 4 + len {
                return match client_hello_sni(&handshake[4..4 + len]) {
                    Some(sni) => Sniffed::Tls(sni),
                    None => Sniffed::Other,
                };
            }
        }
        let Some(header) = buf.get(pos..pos + 5) else {
            return Sniffed::NeedMore;
        };
        if header[0] != 0x16 || header[1] != 3 {
            return Sniffed::Other;
        }
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        let Some(fragment) = buf.get(pos + 5..pos + 5 + len) else {
            return Sniffed::NeedMore;
        };
        handshake.extend_from_slice(fragment);
        pos += 5 + len;
    }
}

/// The SNI of a ClientHello body: `Some(None)` without one, `None` if malformed.
fn client_hello_sni(body: &[u8]) -> Option<Option<String>> {
    let mut r = Reader { buf: body, pos: 0 };
    r.skip(2 + 32)?; // version, random
    let sid = r.u8()? as usize;
    r.skip(sid)?;
    let suites = r.u16()? as usize;
    r.skip(suites)?;
    let compression = r.u8()? as usize;
    r.skip(compression)?;
    if r.pos == body.len() {
        return Some(None);
    }
    let ext_len = r.u16()? as usize;
    let mut ext = Reader {
        buf: r.take(ext_len)?,
        pos: 0,
    };
    while ext.pos < ext.buf.len() {
        let kind = ext.u16()?;
        let len = ext.u16()? as usize;
        let data = ext.take(len)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader { buf: data, pos: 0 };
        let list_len = list.u16()? as usize;
        let mut names = Reader {
            buf: list.take(list_len)?,
            pos: 0,
        };
        while names.pos < names.buf.len() {
            let name_type = names.u8()?;
            let len = names.u16()? as usize;
            let name = names.take(len)?;
            if name_type == 0 {
                return Some(Some(String::from_utf8_lossy(name).into_owned()));
            }
        }
        return Some(None);
    }
    Some(None)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(out)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(drop)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

/// An HTTP request starts with its method (a token: here, uppercase letters, as every
/// method a client sends) and a space. The rest of the head is `http`'s to check.
fn http(buf: &[u8]) -> Sniffed {
    let method = buf.iter().take_while(|b| b.is_ascii_uppercase()).count();
    match buf.get(method) {
        None if method < 32 => Sniffed::NeedMore,
        Some(b' ') if method > 0 => Sniffed::Http,
        _ => Sniffed::Other,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ClientHello with `sni` (if any), in one record.
    pub fn client_hello(sni: Option<&str>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // null compression
        let mut ext = Vec::new();
        ext.extend_from_slice(&[0x00, 0x0a, 0, 4, 0, 2, 0, 0x1d]); // supported groups first
        if let Some(name) = sni {
            let n = name.len() as u16;
            ext.extend_from_slice(&[0, 0]);
            ext.extend_from_slice(&(n + 5).to_be_bytes());
            ext.extend_from_slice(&(n + 3).to_be_bytes());
            ext.push(0);
            ext.extend_from_slice(&n.to_be_bytes());
            ext.extend_from_slice(name.as_bytes());
        }
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn the_server_name_comes_out_of_a_client_hello_even_split_in_records() {
        let hello = client_hello(Some("pypi.org"));
        assert_eq!(sniff(&hello), Sniffed::Tls(Some("pypi.org".into())));
        for n in 0..hello.len() {
            assert_eq!(sniff(&hello[..n]), Sniffed::NeedMore, "at {n}");
        }
        assert_eq!(sniff(&client_hello(None)), Sniffed::Tls(None));
        // The same handshake split over two records.
        let hs = &hello[5..];
        let mut two = vec![0x16, 3, 1, 0, 10];
        two.extend_from_slice(&hs[..10]);
        two.extend_from_slice(&[0x16, 3, 1]);
        two.extend_from_slice(&((hs.len() - 10) as u16).to_be_bytes());
        two.extend_from_slice(&hs[10..]);
        assert_eq!(sniff(&two), Sniffed::Tls(Some("pypi.org".into())));
        assert_eq!(sniff(&[0x16, 3, 1, 0, 4, 2, 0, 0, 0]), Sniffed::Other);
    }

    #[test]
    fn an_http_request_is_known_by_its_method() {
        assert_eq!(sniff(b"GE"), Sniffed::NeedMore);
        assert_eq!(sniff(b"GET /simple/ HTTP/1.1\r\n"), Sniffed::Http);
        assert_eq!(sniff(b"OPTIONS * HTTP/1.1\r\n"), Sniffed::Http);
        assert_eq!(sniff(b"SSH-2.0-OpenSSH\r\n"), Sniffed::Other);
        assert_eq!(sniff(b"GET\t/"), Sniffed::Other);
        assert_eq!(sniff(&[b'A'; 40]), Sniffed::Other);
        assert_eq!(sniff(b"\x00\x01"), Sniffed::Other);
    }
}
