//! Keys by tmux's names (`Enter`, `C-c`, `Up`, `M-x`, `F5`, ...) as the bytes an xterm
//! sends for them, since a process's terminal says `TERM=xterm-256color`; and pasted text,
//! wrapped in bracketed-paste markers when the program asked for them.
//!
//! A key is a name of the table below (in any case, as tmux reads them), a single
//! character, or `^X` (control-X), each with any of the modifiers `C-` (control), `M-`
//! (meta: an ESC before it) and `S-` (shift). The cursor keys follow the program's mode:
//! `ESC O A` in application cursor mode (a full-screen program set DECCKM), `ESC [ A`
//! otherwise. With a modifier, the cursor, editing and function keys take xterm's
//! parameter (`C-Left` is `ESC [ 1 ; 5 D`).
//!
//! For a process without a terminal the bytes go to its stdin pipe as they are, except
//! `Enter` (and `submit`), which is the line feed a terminal's line discipline would have
//! made of the carriage return; `C-c` there is the byte 0x03, not a signal (no terminal
//! turns it into one): send SIGINT with the signal request.

/// What the bytes of a key depend on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyModes {
    /// The process runs on a terminal (else: a pipe).
    pub terminal: bool,
    /// The terminal's cursor keys are in application mode.
    pub application_cursor: bool,
}

/// The allowed forms, for messages.
pub const FORMS: &str = "a key by tmux's name (Enter, Escape, Tab, BTab, Space, BSpace, Up, \
    Down, Left, Right, Home, End, IC, DC, PPage, NPage, F1 to F12; also Insert, Delete, \
    PageUp/PgUp, PageDown/PgDn), a single character, or ^X, each with any of the modifiers C- \
    (control), M- (meta) and S- (shift): C-c, C-d, M-x, C-Left, S-Tab, M-Enter";

/// The keys a name may stand for, before modifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Char(char),
    Enter,
    Tab,
    BTab,
    Space,
    BSpace,
    Escape,
    /// A cursor key: its final byte (A up, B down, C right, D left, H home, F end).
    Cursor(u8),
    /// A key sent as `ESC [ n ~`.
    Tilde(u8),
    /// F1 to F4: `ESC O P` to `ESC O S`.
    Ss3(u8),
}

/// The names of the table, in the case tmux writes them.
const NAMES: &[(&str, Key)] = &[
    ("Enter", Key::Enter),
    ("Tab", Key::Tab),
    ("BTab", Key::BTab),
    ("Space", Key::Space),
    ("BSpace", Key::BSpace),
    ("Escape", Key::Escape),
    ("Up", Key::Cursor(b'A')),
    ("Down", Key::Cursor(b'B')),
    ("Right", Key::Cursor(b'C')),
    ("Left", Key::Cursor(b'D')),
    ("Home", Key::Cursor(b'H')),
    ("End", Key::Cursor(b'F')),
    ("IC", Key::Tilde(2)),
    ("Insert", Key::Tilde(2)),
    ("DC", Key::Tilde(3)),
    ("Delete", Key::Tilde(3)),
    ("PPage", Key::Tilde(5)),
    ("PageUp", Key::Tilde(5)),
    ("PgUp", Key::Tilde(5)),
    ("NPage", Key::Tilde(6)),
    ("PageDown", Key::Tilde(6)),
    ("PgDn", Key::Tilde(6)),
    ("F1", Key::Ss3(b'P')),
    ("F2", Key::Ss3(b'Q')),
    ("F3", Key::Ss3(b'R')),
    ("F4", Key::Ss3(b'S')),
    ("F5", Key::Tilde(15)),
    ("F6", Key::Tilde(17)),
    ("F7", Key::Tilde(18)),
    ("F8", Key::Tilde(19)),
    ("F9", Key::Tilde(20)),
    ("F10", Key::Tilde(21)),
    ("F11", Key::Tilde(23)),
    ("F12", Key::Tilde(24)),
];

#[derive(Debug, Clone, Copy, Default)]
struct Mods {
    ctrl: bool,
    meta: bool,
    shift: bool,
}

impl Mods {
    /// xterm's modifier parameter: 1 + shift + 2 meta + 4 control.
    fn param(self) -> u8 {
        1 + u8::from(self.shift) + 2 * u8::from(self.meta) + 4 * u8::from(self.ctrl)
    }
}

/// The bytes of `keys`, one after the other; an unknown name is an error naming it.
pub fn encode_all(keys: &[String], modes: KeyModes) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for key in keys {
        out.extend(encode(key, modes)?);
    }
    Ok(out)
}

/// The bytes of one key.
pub fn encode(name: &str, modes: KeyModes) -> Result<Vec<u8>, String> {
    let unknown = |why: &str| format!("unknown key `{name}`{why}: give {FORMS}");
    let (mods, key) = parse(name).ok_or_else(|| unknown(""))?;
    let esc = |rest: &[u8]| [&[0x1b], rest].concat();
    let mut bytes = match key {
        Key::Char(c) => {
            let c = if mods.shift { upper(c) } else { c };
            if mods.ctrl {
                vec![control(c).ok_or_else(|| unknown(" (that character has no control code)"))?]
            } else {
                c.to_string().into_bytes()
            }
        }
        Key::Space if mods.ctrl => vec![0],
        Key::Space => vec![b' '],
        Key::Tab if mods.shift => b"\x1b[Z".to_vec(),
        Key::BTab => b"\x1b[Z".to_vec(),
        Key::Enter | Key::Tab | Key::BSpace | Key::Escape if mods.ctrl || mods.shift => {
            return Err(unknown(" (C- and S- do not apply to it; M- does)"));
        }
        Key::Enter if modes.terminal => vec![b'\r'],
        Key::Enter => vec![b'\n'],
        Key::Tab => vec![b'\t'],
        Key::BSpace => vec![0x7f],
        Key::Escape => vec![0x1b],
        Key::Cursor(end) | Key::Ss3(end) if mods.param() > 1 => {
            return Ok(format!("\x1b[1;{}{}", mods.param(), end as char).into_bytes());
        }
        Key::Tilde(n) if mods.param() > 1 => {
            return Ok(format!("\x1b[{n};{}~", mods.param()).into_bytes());
        }
        Key::Cursor(end) if modes.application_cursor => esc(&[b'O', end]),
        Key::Cursor(end) => esc(&[b'[', end]),
        Key::Ss3(end) => esc(&[b'O', end]),
        Key::Tilde(n) => format!("\x1b[{n}~").into_bytes(),
    };
    if mods.meta {
        bytes.insert(0, 0x1b);
    }
    Ok(bytes)
}

/// Text pasted: line ends as a terminal sends them (a carriage return) and, when the
/// program enabled bracketed paste, between `ESC [200~` and `ESC [201~` (an end marker
/// inside the text is taken out, so the text cannot end the paste early and be typed).
/// For a process without a terminal, the text as it is.
pub fn paste(text: &str, modes: KeyModes, bracketed: bool) -> Vec<u8> {
    if !modes.terminal {
        return text.as_bytes().to_vec();
    }
    let text = text.replace("\r\n", "\r").replace('\n', "\r");
    if !bracketed {
        return text.into_bytes();
    }
    let text = text.replace("\x1b[201~", "");
    [b"\x1b[200~", text.as_bytes(), b"\x1b[201~"].concat()
}

/// What `submit` sends: Enter.
pub fn submit(modes: KeyModes) -> &'static [u8] {
    if modes.terminal {
        b"\r"
    } else {
        b"\n"
    }
}

/// The modifiers and the key of a name; None if it names none.
fn parse(name: &str) -> Option<(Mods, Key)> {
    let mut mods = Mods::default();
    let mut rest = name;
    loop {
        if let Some(c) = single(rest) {
            return Some((mods, Key::Char(c)));
        }
        let mut chars = rest.chars();
        match (chars.next(), chars.next()) {
            (Some('^'), Some(_)) if single(&rest[1..]).is_some() => {
                mods.ctrl = true;
                rest = &rest[1..];
            }
            (Some(m), Some('-')) if rest.len() > 2 => {
                match m {
                    'C' | 'c' => mods.ctrl = true,
                    'M' | 'm' => mods.meta = true,
                    'S' | 's' => mods.shift = true,
                    _ => return None,
                }
                rest = &rest[2..];
            }
            _ => {
                let key = NAMES
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(rest))
                    .map(|(_, k)| *k)?;
                return Some((mods, key));
            }
        }
    }
}

/// The only character of `s`, if it has exactly one.
fn single(s: &str) -> Option<char> {
    let mut chars = s.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => Some(c),
        _ => None,
    }
}

fn upper(c: char) -> char {
    let mut up = c.to_uppercase();
    match (up.next(), up.next()) {
        (Some(u), None) => u,
        _ => c,
    }
}

/// The control code of a character, as a terminal sends it: C-a is 0x01, C-@ and C-Space
/// 0x00, C-[ ESC, C-? DEL.
fn control(c: char) -> Option<u8> {
    match c {
        'a'..='z' => Some(c as u8 - b'a' + 1),
        '@'..='_' => Some(c as u8 - b'@'),
        '?' => Some(0x7f),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTY: KeyModes = KeyModes {
        terminal: true,
        application_cursor: false,
    };
    const APP: KeyModes = KeyModes {
        terminal: true,
        application_cursor: true,
    };
    const PIPE: KeyModes = KeyModes {
        terminal: false,
        application_cursor: false,
    };

    fn key(name: &str, modes: KeyModes) -> Vec<u8> {
        encode(name, modes).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn named_keys_are_the_bytes_an_xterm_sends() {
        for (name, bytes) in [
            ("Enter", &b"\r"[..]),
            ("Tab", b"\t"),
            ("BTab", b"\x1b[Z"),
            ("Space", b" "),
            ("BSpace", b"\x7f"),
            ("Escape", b"\x1b"),
            ("Up", b"\x1b[A"),
            ("Down", b"\x1b[B"),
            ("Right", b"\x1b[C"),
            ("Left", b"\x1b[D"),
            ("Home", b"\x1b[H"),
            ("End", b"\x1b[F"),
            ("IC", b"\x1b[2~"),
            ("DC", b"\x1b[3~"),
            ("PPage", b"\x1b[5~"),
            ("NPage", b"\x1b[6~"),
            ("PgUp", b"\x1b[5~"),
            ("F1", b"\x1bOP"),
            ("F4", b"\x1bOS"),
            ("F5", b"\x1b[15~"),
            ("F10", b"\x1b[21~"),
            ("F12", b"\x1b[24~"),
            ("enter", b"\r"),
            ("x", b"x"),
            ("é", "é".as_bytes()),
        ] {
            assert_eq!(key(name, TTY), bytes, "{name}");
        }
    }

    #[test]
    fn control_and_meta_and_shift() {
        for (name, bytes) in [
            ("C-c", &b"\x03"[..]),
            ("C-C", b"\x03"),
            ("^C", b"\x03"),
            ("C-d", b"\x04"),
            ("C-a", b"\x01"),
            ("C-z", b"\x1a"),
            ("C-[", b"\x1b"),
            ("C-@", b"\x00"),
            ("C-Space", b"\x00"),
            ("C-?", b"\x7f"),
            ("M-x", b"\x1bx"),
            ("M-Enter", b"\x1b\r"),
            ("C-M-x", b"\x1b\x18"),
            ("M-C-x", b"\x1b\x18"),
            ("S-a", b"A"),
            ("S-Tab", b"\x1b[Z"),
            ("C-Left", b"\x1b[1;5D"),
            ("S-Up", b"\x1b[1;2A"),
            ("M-Right", b"\x1b[1;3C"),
            ("C-S-End", b"\x1b[1;6F"),
            ("C-DC", b"\x1b[3;5~"),
            ("S-F5", b"\x1b[15;2~"),
            ("C-F1", b"\x1b[1;5P"),
            ("-", b"-"),
        ] {
            assert_eq!(key(name, TTY), bytes, "{name}");
        }
    }

    #[test]
    fn cursor_keys_follow_application_mode() {
        assert_eq!(key("Up", APP), b"\x1bOA");
        assert_eq!(key("Home", APP), b"\x1bOH");
        assert_eq!(key("End", APP), b"\x1bOF");
        // A modifier wins over the mode, as in xterm.
        assert_eq!(key("C-Up", APP), b"\x1b[1;5A");
        // The other keys are not cursor keys.
        assert_eq!(key("PPage", APP), b"\x1b[5~");
    }

    #[test]
    fn a_pipe_gets_line_feeds() {
        assert_eq!(key("Enter", PIPE), b"\n");
        assert_eq!(submit(PIPE), b"\n");
        assert_eq!(submit(TTY), b"\r");
        assert_eq!(key("C-c", PIPE), b"\x03");
        assert_eq!(
            encode_all(&["a".into(), "Enter".into(), "C-d".into()], PIPE).unwrap(),
            b"a\n\x04"
        );
    }

    #[test]
    fn an_unknown_key_is_named_with_the_forms_allowed() {
        for name in ["Foo", "Entr", "C-", "X-a", "F13", "", "C-Enter", "C--"] {
            let error = encode(name, TTY).expect_err(name);
            assert!(error.contains(&format!("`{name}`")), "{error}");
            assert!(error.contains("Enter, Escape, Tab"), "{error}");
            assert!(error.contains("C- (control)"), "{error}");
        }
        // A lone character is itself, `^` and `-` too.
        assert_eq!(key("^", TTY), b"^");
        let error = encode_all(&["Up".into(), "Bogus".into()], TTY).unwrap_err();
        assert!(error.starts_with("unknown key `Bogus`"), "{error}");
    }

    #[test]
    fn pastes_are_bracketed_only_when_asked() {
        assert_eq!(paste("a\nb", TTY, false), b"a\rb");
        assert_eq!(paste("a\r\nb", TTY, true), b"\x1b[200~a\rb\x1b[201~");
        assert_eq!(
            paste("x\x1b[201~rm -rf ~\n", TTY, true),
            b"\x1b[200~xrm -rf ~\r\x1b[201~"
        );
        assert_eq!(paste("a\nb", PIPE, true), b"a\nb");
    }
}
