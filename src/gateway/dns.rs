//! The gateway's DNS server, as pure functions over one message: a question in, an answer
//! out. Only what a stub resolver sends is understood (one question, no compression in
//! it); anything else gets FORMERR or NOTIMP.

use std::net::Ipv4Addr;

/// Record types the gateway answers.
pub const TYPE_A: u16 = 1;

/// One question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub id: u16,
    /// As asked (case kept), without the trailing dot.
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// Flags to echo (RD).
    recursion_desired: bool,
    /// The question's bytes, echoed in the answer.
    raw: Vec<u8>,
}

/// What the server says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An A record (`Some`), or no record of the asked type (`None`: NODATA).
    Found(Option<Ipv4Addr>),
    /// The name does not exist (for the sandbox).
    NxDomain,
}

/// Why a message is not a query the server answers: the reply's RCODE, if one is owed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// Too short or a response: no reply.
    Ignore,
    /// FORMERR (1) or NOTIMP (4), with the id.
    Reply(u16, u8),
}

pub fn parse_query(msg: &[u8]) -> Result<Question, Malformed> {
    if msg.len() < 12 {
        return Err(Malformed::Ignore);
    }
    let id = u16::from_be_bytes([msg[0], msg[1]]);
    let flags = u16::from_be_bytes([msg[2], msg[3]]);
    if flags & 0x8000 != 0 {
        return Err(Malformed::Ignore);
    }
    if (flags >> 11) & 0xf != 0 {
        return Err(Malformed::Reply(id, 4));
    }
    let qdcount = u16::from_be_bytes([msg[4], msg[5]]);
    if qdcount != 1 {
        return Err(Malformed::Reply(id, 1));
    }
    let mut pos = 12;
    let mut labels = Vec::new();
    loop {
        let len = *msg.get(pos).ok_or(Malformed::Reply(id, 1))? as usize;
        pos += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return Err(Malformed::Reply(id, 1));
        }
        let label = msg.get(pos..pos + len).ok_or(Malformed::Reply(id, 1))?;
        labels.push(String::from_utf8_lossy(label).into_owned());
        pos += len;
    }
    let tail = msg.get(pos..pos + 4).ok_or(Malformed::Reply(id, 1))?;
    Ok(Question {
        id,
        name: labels.join("."),
        qtype: u16::from_be_bytes([tail[0], tail[1]]),
        qclass: u16::from_be_bytes([tail[2], tail[3]]),
        recursion_desired: flags & 0x0100 != 0,
        raw: msg[12..pos + 4].to_vec(),
    })
}

/// The reply to `q`: answers carry a TTL of `ttl` seconds.
pub fn reply(q: &Question, answer: &Answer, ttl: u32) -> Vec<u8> {
    let (rcode, record) = match answer {
        Answer::Found(a) => (0u16, *a),
        Answer::NxDomain => (3, None),
    };
    let mut flags = 0x8000 | 0x0080 | rcode; // QR, RA
    if q.recursion_desired {
        flags |= 0x0100;
    }
    let mut out = Vec::with_capacity(q.raw.len() + 32);
    out.extend_from_slice(&q.id.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::from(record.is_some()).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&q.raw);
    if let Some(addr) = record {
        out.extend_from_slice(&[0xc0, 12]); // the question's name
        out.extend_from_slice(&TYPE_A.to_be_bytes());
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&ttl.to_be_bytes());
        out.extend_from_slice(&4u16.to_be_bytes());
        out.extend_from_slice(&addr.octets());
    }
    out
}

/// The reply to a message that is a query the server does not answer.
pub fn error_reply(id: u16, rcode: u8) -> Vec<u8> {
    let flags = 0x8000u16 | 0x0080 | u16::from(rcode);
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&1u16.to_be_bytes());
        q
    }

    #[test]
    fn a_query_is_answered_with_one_record_or_nxdomain() {
        let q = parse_query(&query("PyPI.org", TYPE_A)).unwrap();
        assert_eq!((q.id, q.name.as_str(), q.qtype), (0x1234, "PyPI.org", 1));
        let r = reply(&q, &Answer::Found(Some(Ipv4Addr::new(198, 19, 0, 1))), 60);
        assert_eq!(&r[0..2], &[0x12, 0x34]);
        assert_eq!(r[3] & 0xf, 0);
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1);
        assert_eq!(&r[r.len() - 4..], &[198, 19, 0, 1]);
        let r = reply(&q, &Answer::NxDomain, 60);
        assert_eq!(r[3] & 0xf, 3);
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 0);
    }

    #[test]
    fn garbage_is_refused_without_panicking() {
        assert_eq!(parse_query(b"short"), Err(Malformed::Ignore));
        let mut q = query("a.b", TYPE_A);
        q[5] = 2;
        assert_eq!(parse_query(&q), Err(Malformed::Reply(0x1234, 1)));
        let q = query("a.b", TYPE_A);
        assert!(parse_query(&q[..q.len() - 2]).is_err());
        for n in 0..q.len() {
            let _ = parse_query(&q[..n]);
        }
    }
}
