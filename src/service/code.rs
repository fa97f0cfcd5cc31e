//! Code over the server's `limits.max_code`, measured in the request's JSON text without
//! decoding it into memory: a request's body is then never amplified by its code, and
//! the refusal's audit record still has the code's head, its whole size and sha256.

use sha2::Digest;

/// What is kept of code that was refused for its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measured {
    /// The first `cap` bytes (cut at a character boundary).
    pub head: String,
    /// The decoded code's size in bytes, and its sha256.
    pub size: u64,
    pub sha256: String,
}

/// A JSON string's text (with its quotes, as in the body) decoded on the fly: its size,
/// sha256 and first `cap` bytes. None if it is not a well-formed JSON string.
pub fn measure(raw: &str, cap: usize) -> Option<Measured> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    let mut hash = sha2::Sha256::new();
    let mut head = String::new();
    let mut size = 0u64;
    let mut buf = [0u8; 4];
    let mut put = |c: char, hash: &mut sha2::Sha256, head: &mut String| {
        let bytes = c.encode_utf8(&mut buf).as_bytes();
        hash.update(bytes);
        size += bytes.len() as u64;
        if head.len() + bytes.len() <= cap {
            head.push(c);
        }
    };
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            put(c, &mut hash, &mut head);
            continue;
        }
        let decoded = match chars.next()? {
            '"' => '"',
            '\\' => '\\',
            '/' => '/',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'u' => {
                let first = unit(&mut chars)?;
                if (0xD800..0xDC00).contains(&first) {
                    // A surrogate pair: `\uD83D\uDE00`.
                    (chars.next()? == '\\' && chars.next()? == 'u').then_some(())?;
                    let second = unit(&mut chars)?;
                    let code = 0x10000 + ((first - 0xD800) << 10) + (second.checked_sub(0xDC00)?);
                    char::from_u32(code)?
                } else {
                    char::from_u32(first)?
                }
            }
            _ => return None,
        };
        put(decoded, &mut hash, &mut head);
    }
    Some(Measured {
        head,
        size,
        sha256: format!("{:x}", hash.finalize()),
    })
}

/// The four hex digits of a `\u` escape.
fn unit(chars: &mut std::str::Chars<'_>) -> Option<u32> {
    let hex: String = chars.by_ref().take(4).collect();
    (hex.len() == 4).then_some(())?;
    u32::from_str_radix(&hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_what_serde_json_decodes() {
        for text in ["plain", "a\nb\t\"q\" \\ /", "é ☃ 😀 \u{1}", ""] {
            let raw = serde_json::to_string(text).unwrap();
            let m = measure(&raw, 3).unwrap();
            assert_eq!(m.size, text.len() as u64, "{raw}");
            assert_eq!(
                m.sha256,
                format!("{:x}", sha2::Sha256::digest(text.as_bytes()))
            );
            assert!(text.starts_with(&m.head) && m.head.len() <= 3, "{raw}");
        }
        let m = measure(r#""\ud83d\ude00\u00e9""#, 100).unwrap();
        assert_eq!(m.head, "😀é");
        assert!(measure(r#""\x""#, 10).is_none());
        assert!(measure("no quotes", 10).is_none());
    }
}
