//! A run's or a call's result as messages ready to send to a chat channel, cut where the
//! channel cuts, with what the messages cannot hold attached as files (issue 28).
//!
//! No I/O: [`render`] takes an [`Outcome`] or a [`CallOutcome`] (through [`Input`]) and
//! [`Options`], and gives [`Formatted`] `{channel, messages, attachments, truncated}`.
//!
//! # The channels, their limits and escaping rules
//!
//! | channel | code | limit a message | escaping |
//! |---|---|---|---|
//! | `discord` | ```` ```lang ```` … ```` ``` ```` | 2 000 | a backtick run is broken by U+200B; prose: `\` before Markdown punctuation |
//! | `telegram` | `<pre><code class="language-lang">` … `</code></pre>` (`parse_mode=HTML`) | 4 096 | `&`, `<`, `>` as `&amp;`, `&lt;`, `&gt;` |
//! | `slack` | ```` ``` ```` … ```` ``` ```` (mrkdwn; no language tag) | 3 000 (a section block's text) | `&`, `<`, `>` as entities; backtick runs broken by U+200B |
//! | `whatsapp` | ```` ``` ```` … ```` ``` ```` (monospace; no language tag) | 4 096 | backtick runs broken by U+200B |
//! | `markdown` | a backtick fence longer than any backtick run in the text | none (or `max_chars`) | prose: `\` before ASCII punctuation |
//! | `plain` | the text as is | none (or `max_chars`) | none |
//!
//! Sources (checked 2026-11 through the project's documentation search; the platforms' own
//! pages are named, with the secondary pages that quote them):
//! - Discord: a message's `content` is at most 2 000 characters (Discord API, "Create
//!   Message", <https://discord.com/developers/docs/resources/message#create-message>;
//!   twilight-http's `CreateMessage::content` states "2000 UTF-16 characters",
//!   <https://docs.rs/twilight-http/0.7.0/twilight_http/request/channel/message/create_message/struct.CreateMessage.html>;
//!   @sapphire/discord-utilities' `MessageLimits.MaximumLength` is 2000). A code block ends
//!   at the next ```` ``` ```` whatever its line, and has no escape inside it: a run of
//!   backticks in the output is broken with a zero-width space. Outside code a backslash
//!   escapes Markdown punctuation. Send with `allowed_mentions: {"parse": []}` so that an
//!   `@everyone` in the output pings nobody.
//! - Telegram: `sendMessage`'s `text` is "1-4096 characters after entities parsing"; in
//!   HTML style "all `<`, `>` and `&` symbols that are not a part of a tag or an HTML
//!   entity must be replaced with the corresponding HTML entities" (`&lt;`, `&gt;`,
//!   `&amp;`); `<pre><code class="language-python">` gives a block with a language
//!   (Bot API, <https://core.telegram.org/bots/api#sendmessage> and
//!   <https://core.telegram.org/bots/api#formatting-options>, as quoted by teloxide-core's
//!   `SendMessage` and grammY's `ParseMode`). Entity offsets and lengths count UTF-16 code
//!   units.
//! - Slack: a section block's `text` is at most 3 000 characters (Block Kit reference,
//!   <https://api.slack.com/reference/block-kit/blocks#section>); "Slack uses `&`, `<`, and
//!   `>` as control characters for special parsing in text objects, so they must be
//!   converted to HTML entities" (<https://api.slack.com/reference/surfaces/formatting>);
//!   code blocks are ```` ``` ```` with no language tag and, as in Discord, no escape
//!   inside. Each message here is one section block's text (a message's blocks together
//!   are capped lower than 50 x 3 000: post one message per section).
//! - WhatsApp: a text message's `body` is at most 4 096 characters (Cloud API, "Text
//!   messages", <https://developers.facebook.com/docs/whatsapp/cloud-api/messages/text-messages>;
//!   360dialog's messaging docs, whatsapp-api-js's `Text`); monospace is
//!   ```` ```text``` ```` with no language tag, and no escape (WhatsApp Help Center, "How
//!   to format your messages").
//!
//! Every limit is counted here in UTF-16 code units of the text as sent (markup and
//! entities included). That count is never below the number of Unicode characters, nor
//! below Telegram's count after entity parsing, so a message is within the limit however
//! the platform counts.
//!
//! # What a message holds, and where it is cut
//!
//! stdout (with the language tag), stderr (marked `stderr:`), a call's trailing value
//! (`result:`) and its exception (in words, then the traceback), then the error in words
//! (`Error (timeout): ...`), the exit status or signal when it is not 0, and the names of
//! the attachments. Figures (a call's displays' PNGs and JPEGs) and output files (with
//! their bytes) are attachments.
//!
//! The display text of a stream is its output as UTF-8 with terminal escapes (colours)
//! and other control characters taken out, carriage-return overwrites applied as a
//! terminal would. When the messages cannot hold a stream whole (`max_messages` of them,
//! each within the limit), it is cut at a line boundary (at a character boundary when a
//! line alone is too long), never inside a UTF-8 sequence, an entity, an escape or a
//! fence: stdout and a result keep their head, stderr and a traceback their tail, and a
//! line says how much was left out ("… 1 234 more lines, full output attached as
//! output.txt"). The exact bytes of a stream that was cut or whose display text differs
//! from them are attached (`output.txt`, `stderr.txt`, `result.txt`, `traceback.txt`),
//! so the messages and the attachments together always hold the whole output.
//! `truncated` is true when a stream was cut.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize, Serializer};

use crate::files::OutputFile;
use crate::outcome::{ErrorKind, Outcome};
use crate::session::{CallOutcome, Exception, MimeBundle};

/// Where the messages are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    Discord,
    Telegram,
    Slack,
    Whatsapp,
    Markdown,
    Plain,
}

impl Channel {
    pub const ALL: [Channel; 6] = [
        Channel::Discord,
        Channel::Telegram,
        Channel::Slack,
        Channel::Whatsapp,
        Channel::Markdown,
        Channel::Plain,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Channel::Discord => "discord",
            Channel::Telegram => "telegram",
            Channel::Slack => "slack",
            Channel::Whatsapp => "whatsapp",
            Channel::Markdown => "markdown",
            Channel::Plain => "plain",
        }
    }

    /// The platform's limit on one message, in UTF-16 code units (see the module's doc);
    /// None for `markdown` and `plain`, which have none of their own.
    pub fn limit(self) -> Option<usize> {
        match self {
            Channel::Discord => Some(2000),
            Channel::Telegram => Some(4096),
            Channel::Slack => Some(3000),
            Channel::Whatsapp => Some(4096),
            Channel::Markdown | Channel::Plain => None,
        }
    }

    fn allowed() -> String {
        Channel::ALL.map(Channel::name).join(", ")
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An option that cannot be honoured: the message names it and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError(pub String);

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FormatError {}

impl FromStr for Channel {
    type Err = FormatError;

    fn from_str(text: &str) -> Result<Channel, FormatError> {
        Channel::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(text))
            .ok_or_else(|| {
                FormatError(format!(
                    "unknown format {text:?}: give one of {}",
                    Channel::allowed()
                ))
            })
    }
}

/// The smallest `max_chars`: what the words about a result take, with room for output.
pub const MIN_CHARS: usize = 1000;
/// The most messages one result is rendered into.
pub const MAX_MESSAGES: usize = 100;

/// How to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub channel: Channel,
    /// At most this many messages (default 1); past them, output is cut and attached.
    pub max_messages: usize,
    /// The code blocks' language tag (`python`); none by default. Slack and WhatsApp take
    /// none.
    pub language: Option<String>,
    /// A smaller (or, where the sender may send more, e.g. Discord Nitro's 4 000, larger)
    /// limit than the channel's, in UTF-16 code units; the limit for markdown and plain.
    pub max_chars: Option<usize>,
}

impl Options {
    pub fn new(channel: Channel) -> Options {
        Options {
            channel,
            max_messages: 1,
            language: None,
            max_chars: None,
        }
    }

    /// Checks the options; the error names the option and what it may be.
    pub fn validate(&self) -> Result<(), FormatError> {
        if !(1..=MAX_MESSAGES).contains(&self.max_messages) {
            return Err(FormatError(format!(
                "max_messages {}: give a number from 1 to {MAX_MESSAGES}",
                self.max_messages
            )));
        }
        if let Some(lang) = &self.language {
            let ok = (1..=32).contains(&lang.len())
                && lang
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-_.#".contains(c));
            if !ok {
                return Err(FormatError(format!(
                    "language {lang:?}: give 1 to 32 of the characters A-Z a-z 0-9 + - _ . # (python, js, c++)"
                )));
            }
        }
        if let Some(n) = self.max_chars {
            if n < MIN_CHARS {
                return Err(FormatError(format!(
                    "max_chars {n}: give at least {MIN_CHARS} (the words about the result need room)"
                )));
            }
        }
        Ok(())
    }

    fn limit(&self) -> Option<usize> {
        self.max_chars.or(self.channel.limit())
    }
}

/// What a request asks for, as a front end reads it from JSON: `"format": "telegram"`, or
/// `"format": {"channel": "telegram", "max_messages": 3, "language": "python",
/// "max_chars": 4000}` (unknown keys refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatRequest {
    Channel(Channel),
    Options(FormatRequestOptions),
}

/// Its OpenAPI schema: `oneOf` [`Channel`] and [`FormatRequestOptions`] (read by the
/// visitor below, as serde's untagged enums would be, without buffering).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for FormatRequest {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{OneOfBuilder, Ref};
        OneOfBuilder::new()
            .item(Ref::from_schema_name("Channel"))
            .item(Ref::from_schema_name("FormatRequestOptions"))
            .description(Some(
                "a channel's name, or {channel, max_messages, language, max_chars}",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for FormatRequest {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema as _;
        schemas.push(("Channel".into(), Channel::schema()));
        schemas.push((
            "FormatRequestOptions".into(),
            FormatRequestOptions::schema(),
        ));
    }
}

impl<'de> Deserialize<'de> for FormatRequest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<FormatRequest, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FormatRequest;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(
                    f,
                    "a channel ({}) or {{\"channel\", \"max_messages\", \"language\", \"max_chars\"}}",
                    Channel::allowed()
                )
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<FormatRequest, E> {
                text.parse().map(FormatRequest::Channel).map_err(E::custom)
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<FormatRequest, A::Error> {
                FormatRequestOptions::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(FormatRequest::Options)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The object form of [`FormatRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct FormatRequestOptions {
    pub channel: Channel,
    #[serde(default)]
    pub max_messages: Option<usize>,
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub max_chars: Option<usize>,
}

impl FormatRequest {
    /// The options, checked; the error names the field and what it may be.
    pub fn options(&self) -> Result<Options, FormatError> {
        let options = match self {
            FormatRequest::Channel(channel) => Options::new(*channel),
            FormatRequest::Options(o) => Options {
                channel: o.channel,
                max_messages: o.max_messages.unwrap_or(1),
                language: o.language.clone(),
                max_chars: o.max_chars,
            },
        };
        options.validate()?;
        Ok(options)
    }
}

/// The messages to send, in order, and the files to send with them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Formatted {
    pub channel: Channel,
    pub messages: Vec<String>,
    pub attachments: Vec<Attachment>,
    /// A stream was cut: the messages hold part of it, its attachment all of it.
    pub truncated: bool,
}

/// A file to send with the messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attachment {
    pub name: String,
    pub media_type: String,
    pub size: u64,
    pub sha256: String,
    /// The bytes, base64 in JSON.
    #[serde(serialize_with = "base64_data")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = Byte))]
    pub data: Vec<u8>,
}

impl Attachment {
    pub fn new(name: impl Into<String>, media_type: impl Into<String>, data: Vec<u8>) -> Self {
        use sha2::{Digest, Sha256};
        let sha256 = Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Attachment {
            name: name.into(),
            media_type: media_type.into(),
            size: data.len() as u64,
            sha256,
            data,
        }
    }
}

fn base64_data<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
    use base64::Engine as _;
    s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(data))
}

/// What is rendered: the parts of a run's [`Outcome`] or a call's [`CallOutcome`].
#[derive(Debug, Clone, Default)]
pub struct Input<'a> {
    pub stdout: &'a [u8],
    pub stderr: &'a [u8],
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<ErrorKind>,
    pub message: Option<&'a str>,
    /// Output was cut at the output limit by the sandbox.
    pub output_limit_hit: bool,
    /// A call's trailing value (its `text/plain`).
    pub result: Option<&'a str>,
    pub exception: Option<&'a Exception>,
    /// A call's displays and result: their images become figures.
    pub bundles: Vec<&'a MimeBundle>,
    pub files: &'a [OutputFile],
}

impl<'a> From<&'a Outcome> for Input<'a> {
    fn from(o: &'a Outcome) -> Input<'a> {
        Input {
            stdout: &o.stdout,
            stderr: &o.stderr,
            exit_code: o.exit_code,
            signal: o.signal,
            error: o.error,
            message: o.message.as_deref(),
            output_limit_hit: o.truncated,
            files: &o.files,
            ..Input::default()
        }
    }
}

impl<'a> From<&'a CallOutcome> for Input<'a> {
    fn from(c: &'a CallOutcome) -> Input<'a> {
        let mut input = Input::from(&c.outcome);
        input.result = c
            .result
            .as_ref()
            .and_then(|r| r.get("text/plain"))
            .map(String::as_str);
        // A cell's exception is said in words; its kind is not an error of the sandbox.
        input.exception = c.exception.as_ref();
        input.bundles = c.displays.iter().chain(c.result.iter()).collect();
        input
    }
}

/// Renders a result for a channel. The only error is an option out of range.
pub fn render<'a>(
    input: impl Into<Input<'a>>,
    options: &Options,
) -> Result<Formatted, FormatError> {
    options.validate()?;
    Ok(lay_out(&input.into(), options).formatted)
}

// ---------------------------------------------------------------------------------------
// Streams, display text, cuts.

/// One text the messages show in code blocks.
#[derive(Debug, Clone)]
pub(crate) struct Stream {
    pub(crate) name: &'static str,
    label: Option<&'static str>,
    noun: &'static str,
    file: &'static str,
    tagged: bool,
    keep_tail: bool,
    raw: Vec<u8>,
    pub(crate) display: String,
}

impl Stream {
    fn exact(&self) -> bool {
        self.display.as_bytes() == self.raw.as_slice()
    }
}

/// The text a chat shows for output: UTF-8 (invalid sequences as U+FFFD), without
/// terminal escape sequences and control characters other than tab and newline, each
/// line as a terminal leaves it after carriage returns.
pub fn display_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    let mut line = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => match chars.next() {
                // CSI: parameters and intermediates, then a final byte 0x40-0x7e.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('\x40'..='\x7e').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC, DCS, APC, PM, SOS: up to BEL or ESC \.
                Some(']' | 'P' | '_' | '^' | 'X') => {
                    while let Some(c) = chars.next() {
                        if c == '\x07' {
                            break;
                        }
                        if c == '\x1b' {
                            if chars.peek() == Some(&'\\') {
                                chars.next();
                            }
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\n' => {
                out.push_str(&line);
                out.push('\n');
                line.clear();
            }
            '\r' => {
                if chars.peek() != Some(&'\n') && chars.peek().is_some() {
                    line.clear();
                }
            }
            '\t' => line.push(c),
            c if c.is_control() => {}
            c => line.push(c),
        }
    }
    out.push_str(&line);
    out
}

fn streams(input: &Input) -> Vec<Stream> {
    let mut streams = Vec::new();
    let mut add = |name, label, noun, file, tagged, keep_tail, raw: Vec<u8>| {
        if !raw.is_empty() {
            let display = display_text(&raw);
            streams.push(Stream {
                name,
                label,
                noun,
                file,
                tagged,
                keep_tail,
                raw,
                display,
            });
        }
    };
    add(
        "stdout",
        None,
        "output",
        "output.txt",
        true,
        false,
        input.stdout.to_vec(),
    );
    add(
        "stderr",
        Some("stderr:"),
        "stderr",
        "stderr.txt",
        false,
        true,
        input.stderr.to_vec(),
    );
    if let Some(result) = input.result {
        add(
            "result",
            Some("result:"),
            "result",
            "result.txt",
            true,
            false,
            result.as_bytes().to_vec(),
        );
    }
    if let Some(e) = input.exception {
        add(
            "traceback",
            Some("traceback:"),
            "traceback",
            "traceback.txt",
            false,
            true,
            e.traceback.concat().into_bytes(),
        );
    }
    streams
}

/// The part of `text` a cut keeps: about `keep` characters from its head (or tail), at
/// the nearest line boundary when one is in the second half of that, else at a
/// character boundary. Returns the byte range kept.
pub(crate) fn cut(text: &str, keep: usize, tail: bool) -> std::ops::Range<usize> {
    let total = text.chars().count();
    if keep >= total {
        return 0..text.len();
    }
    if keep == 0 {
        return if tail { text.len()..text.len() } else { 0..0 };
    }
    if !tail {
        let end = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
        match text[..end].rfind('\n') {
            Some(nl) if text[..=nl].chars().count() * 2 >= keep => 0..nl + 1,
            _ => 0..end,
        }
    } else {
        let start = text
            .char_indices()
            .nth(total - keep)
            .map_or(text.len(), |(i, _)| i);
        if text.as_bytes()[start - 1] == b'\n' {
            return start..text.len();
        }
        match text[start..].find('\n').map(|i| start + i + 1) {
            Some(b) if b < text.len() && text[b..].chars().count() * 2 >= keep => b..text.len(),
            _ => start..text.len(),
        }
    }
}

/// What a cut left out, in words: "… 1 234 more lines, full output attached as output.txt".
fn notice(s: &Stream, range: &std::ops::Range<usize>, file: &str) -> String {
    let text = &s.display;
    if range.len() == text.len() {
        return format!(
            "(control characters and terminal escapes left out; the exact {} is attached as {file})",
            s.noun
        );
    }
    let (left, mid_line) = if s.keep_tail {
        let left = &text[..range.start];
        (left, range.start > 0 && !left.ends_with('\n'))
    } else {
        let shown = &text[range.clone()];
        (
            &text[range.end..],
            !shown.is_empty() && !shown.ends_with('\n'),
        )
    };
    let (n, noun) = if mid_line {
        (left.chars().count(), "character")
    } else {
        (lines_in(left), "line")
    };
    let s_ = if n == 1 { "" } else { "s" };
    let n = grouped(n);
    match (range.is_empty(), s.keep_tail) {
        (true, _) => {
            let lines = lines_in(text);
            let s_ = if lines == 1 { "" } else { "s" };
            format!(
                "… {} ({} line{s_}) attached as {file}",
                s.name,
                grouped(lines)
            )
        }
        (false, false) => format!("… {n} more {noun}{s_}, full {} attached as {file}", s.noun),
        (false, true) => format!(
            "… {n} earlier {noun}{s_} left out, full {} attached as {file}",
            s.noun
        ),
    }
}

fn lines_in(text: &str) -> usize {
    let newlines = text.matches('\n').count();
    newlines + usize::from(!text.is_empty() && !text.ends_with('\n'))
}

/// 1234567 as "1 234 567".
pub(crate) fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(d);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Channel markup.

fn utf16_len(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

const ZWSP: char = '\u{200b}';

/// Inserts U+200B after a backtick that a backtick or U+200B follows, so that no two
/// backticks touch (and a U+200B already there survives the reverse, [`unbreak_backticks`]).
fn break_backticks(text: &str, out: &mut String) {
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '`' && matches!(chars.peek(), Some(&'`' | &ZWSP)) {
            out.push(ZWSP);
        }
    }
}

/// The reverse of [`break_backticks`].
#[cfg(test)]
pub(crate) fn unbreak_backticks(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '`' && chars.peek() == Some(&ZWSP) {
            chars.next();
        }
    }
    out
}

fn html_escape(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
}

impl Channel {
    /// A code block's body as sent.
    fn escape_code(self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 16);
        match self {
            Channel::Discord | Channel::Whatsapp => break_backticks(text, &mut out),
            Channel::Slack => {
                let mut broken = String::with_capacity(text.len());
                break_backticks(text, &mut broken);
                html_escape(&broken, &mut out);
            }
            Channel::Telegram => html_escape(text, &mut out),
            Channel::Markdown | Channel::Plain => out.push_str(text),
        }
        out
    }

    /// What one character of code costs at most, sent (`next`: the one after it).
    fn code_cost(self, c: char, next: Option<char>) -> usize {
        let backtick = usize::from(c == '`' && matches!(next, Some('`' | ZWSP)));
        match self {
            Channel::Discord | Channel::Whatsapp => c.len_utf16() + backtick,
            Channel::Slack | Channel::Telegram => {
                let base = match c {
                    '&' => 5,
                    '<' | '>' => 4,
                    c => c.len_utf16(),
                };
                base + if self == Channel::Slack { backtick } else { 0 }
            }
            Channel::Markdown | Channel::Plain => c.len_utf16(),
        }
    }

    /// Words of ours and names from the run, as sent outside code.
    fn escape_prose(self, text: &str) -> String {
        let mut out = String::with_capacity(text.len() + 8);
        match self {
            Channel::Telegram => html_escape(text, &mut out),
            Channel::Slack => {
                let mut broken = String::new();
                break_backticks(text, &mut broken);
                html_escape(&broken, &mut out);
            }
            Channel::Whatsapp => break_backticks(text, &mut out),
            Channel::Discord | Channel::Markdown => {
                for c in text.chars() {
                    let special = match self {
                        Channel::Discord => "\\`*_~|>#[]<@".contains(c),
                        _ => "\\`*_[]<>!&~|#".contains(c),
                    };
                    if special {
                        out.push('\\');
                    }
                    out.push(c);
                }
            }
            Channel::Plain => out.push_str(text),
        }
        out
    }

    fn bold(self, text: &str) -> String {
        match self {
            Channel::Discord | Channel::Markdown => format!("**{text}**"),
            Channel::Telegram => format!("<b>{text}</b>"),
            Channel::Slack | Channel::Whatsapp => format!("*{text}*"),
            Channel::Plain => text.to_string(),
        }
    }

    /// The opening and closing of a code block (`fence`: markdown's backtick count).
    fn fences(self, lang: Option<&str>, fence: usize) -> (String, String) {
        let lang = lang.unwrap_or("");
        match self {
            Channel::Discord => (format!("```{lang}\n"), "\n```".into()),
            Channel::Slack | Channel::Whatsapp => ("```\n".into(), "\n```".into()),
            Channel::Markdown => {
                let f = "`".repeat(fence);
                (format!("{f}{lang}\n"), format!("\n{f}"))
            }
            Channel::Telegram if lang.is_empty() => ("<pre>".into(), "</pre>".into()),
            Channel::Telegram => (
                format!("<pre><code class=\"language-{lang}\">"),
                "</code></pre>".into(),
            ),
            Channel::Plain => (String::new(), String::new()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Layout.

/// A piece of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Words, as sent.
    Prose(String),
    /// Part of a stream's display text (raw), shown in a code block.
    Code {
        stream: usize,
        lang: Option<String>,
        fence: usize,
        text: String,
    },
}

#[derive(Debug, Clone)]
enum Block {
    Prose(String),
    Code {
        stream: usize,
        lang: Option<String>,
        fence: usize,
        text: String,
    },
}

/// What [`render`] gives, with how it was made (the tests read the rest).
#[derive(Debug, Clone)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Layout {
    pub(crate) formatted: Formatted,
    pub(crate) streams: Vec<Stream>,
    /// Byte range of each stream's display text the messages hold.
    pub(crate) kept: Vec<std::ops::Range<usize>>,
    pub(crate) segments: Vec<Vec<Segment>>,
}

/// At most `max` UTF-16 units of `text` escaped for `channel`, cut at a character
/// boundary before escaping (never inside an entity or an escape), with "…" if cut.
fn capped_prose(channel: Channel, text: &str, max: usize) -> String {
    // One line: a newline in an exception's value must not start a heading, a list or a
    // quote.
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.as_str();
    let escaped = channel.escape_prose(text);
    if utf16_len(&escaped) <= max {
        return escaped;
    }
    let mut kept = String::new();
    let mut cost = 1;
    for c in text.chars() {
        let c_cost = utf16_len(&channel.escape_prose(&c.to_string()));
        if cost + c_cost > max {
            break;
        }
        cost += c_cost;
        kept.push(c);
    }
    // Backticks broken across the cut are still broken: escaping the kept part as a whole
    // costs no more than the characters did one by one, plus their U+200B.
    let mut out = channel.escape_prose(&kept);
    while utf16_len(&out) + 1 > max && kept.pop().is_some() {
        out = channel.escape_prose(&kept);
    }
    out.push('…');
    out
}

/// `wanted`, or `stem-2.ext`, `stem-3.ext`... when another attachment has that name.
fn unique_name(wanted: &str, taken: &[&str]) -> String {
    let (stem, ext) = wanted.rsplit_once('.').unwrap_or((wanted, ""));
    let mut name = wanted.to_string();
    let mut n = 2;
    while taken.contains(&name.as_str()) {
        name = format!("{stem}-{n}.{ext}");
        n += 1;
    }
    name
}

fn figures(input: &Input) -> (Vec<Attachment>, Vec<String>) {
    use base64::Engine as _;
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for bundle in &input.bundles {
        for (media, ext) in [("image/png", "png"), ("image/jpeg", "jpg")] {
            if let Some(b64) = bundle.get(media) {
                let n = out.len() + 1;
                match base64::engine::general_purpose::STANDARD.decode(b64.trim()) {
                    Ok(bytes) => {
                        let files: Vec<&str> =
                            input.files.iter().map(|f| f.path.as_str()).collect();
                        let name = unique_name(&format!("figure-{n}.{ext}"), &files);
                        out.push(Attachment::new(name, media, bytes))
                    }
                    Err(_) => notes.push(format!("A figure ({media}) was not valid base64.")),
                }
                break;
            }
        }
    }
    (out, notes)
}

pub(crate) fn lay_out(input: &Input, options: &Options) -> Layout {
    let channel = options.channel;
    let limit = options.limit();
    let streams = streams(input);
    let lang = match channel {
        Channel::Slack | Channel::Whatsapp | Channel::Plain => None,
        _ => options.language.clone(),
    };

    // Attachments that do not depend on the cut: figures, output files.
    let (mut attachments, mut notes) = figures(input);
    let mut unsent = Vec::new();
    for file in input.files {
        match &file.data {
            Some(data) => {
                attachments.push(Attachment::new(&file.path, &file.media_type, data.clone()))
            }
            None => unsent.push(format!("{} ({} bytes)", file.path, file.size)),
        }
    }
    if !unsent.is_empty() {
        notes.push(format!(
            "Output files not attached (their bytes were not kept): {}.",
            unsent.join(", ")
        ));
    }

    // The words, capped so that they leave room for output in the first message.
    let room = limit.unwrap_or(usize::MAX);
    let mut tail_prose: Vec<String> = Vec::new();
    if let Some(e) = input.exception {
        let words = format!("{}: {}", e.name, e.value);
        tail_prose.push(format!(
            "{} {}",
            channel.bold("Exception:"),
            capped_prose(channel, &words, (room / 7).min(300))
        ));
    }
    if let Some(kind) = input
        .error
        .filter(|k| *k != ErrorKind::Exception || input.exception.is_none())
    {
        let kind = serde_json::to_value(kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let words = match input.message {
            Some(m) => format!("{kind}: {m}"),
            None => kind,
        };
        tail_prose.push(format!(
            "{} {}",
            channel.bold("Error:"),
            capped_prose(channel, &words, (room / 5).min(400))
        ));
    } else if let Some(m) = input.message.filter(|m| !m.is_empty()) {
        tail_prose.push(capped_prose(channel, m, (room / 5).min(400)));
    }
    if input.output_limit_hit && input.error != Some(ErrorKind::OutputLimit) {
        tail_prose.push(channel.escape_prose("Output was cut at the sandbox's output limit."));
    }
    match (input.exit_code, input.signal, input.error) {
        (Some(code), _, None) if code != 0 => {
            tail_prose.push(channel.escape_prose(&format!("Exit status {code}.")))
        }
        (None, Some(sig), None) => {
            tail_prose.push(channel.escape_prose(&format!("Ended by signal {sig}.")))
        }
        _ => {}
    }
    if !notes.is_empty() {
        tail_prose.push(capped_prose(channel, &notes.join(" "), (room / 8).min(250)));
    }

    // Of the text shown, not the whole stream's: a stream of 865 backticks cut to fit
    // 1 000 characters needs a fence longer than the run it shows, not than the run it had
    // (a fence of 866 around any part of it could not fit, and the message came out empty).
    let fence = |shown: &str| {
        let mut longest = 0;
        let mut run = 0;
        for c in shown.chars() {
            run = if c == '`' { run + 1 } else { 0 };
            longest = longest.max(run);
        }
        (longest + 1).max(3)
    };

    // One attempt: keep[i] characters of stream i.
    let attempt = |keep: &[usize]| {
        let mut blocks = Vec::new();
        let mut cut_attachments = Vec::new();
        let mut kept = Vec::new();
        let mut truncated = false;
        for (i, s) in streams.iter().enumerate() {
            let range = cut(&s.display, keep[i], s.keep_tail);
            let whole = range.len() == s.display.len();
            let attach = !whole || !s.exact();
            let file = if attach {
                let taken: Vec<&str> = attachments
                    .iter()
                    .chain(&cut_attachments)
                    .map(|a| a.name.as_str())
                    .chain(input.files.iter().map(|f| f.path.as_str()))
                    .collect();
                let name = unique_name(s.file, &taken);
                cut_attachments.push(Attachment::new(&name, "text/plain", s.raw.clone()));
                Some(name)
            } else {
                None
            };
            truncated |= !whole;
            let shown = &s.display[range.clone()];
            if let Some(label) = s.label {
                blocks.push(Block::Prose(channel.bold(label)));
            }
            if !shown.is_empty() {
                blocks.push(Block::Code {
                    stream: i,
                    lang: if s.tagged { lang.clone() } else { None },
                    fence: fence(shown),
                    text: shown.to_string(),
                });
            }
            if let Some(file) = file {
                let words = notice(s, &range, &file);
                let notice = Block::Prose(channel.escape_prose(&words));
                // Said before the block for a tail, after it for a head.
                if s.keep_tail && !shown.is_empty() {
                    let at = blocks.len() - 1;
                    blocks.insert(at, notice);
                } else {
                    blocks.push(notice);
                }
            }
            kept.push(range);
        }
        for p in &tail_prose {
            blocks.push(Block::Prose(p.clone()));
        }
        let all: Vec<&Attachment> = attachments.iter().chain(&cut_attachments).collect();
        if !all.is_empty() {
            let names: Vec<&str> = all.iter().map(|a| a.name.as_str()).collect();
            let words = format!("Attached: {}", names.join(", "));
            blocks.push(Block::Prose(capped_prose(
                channel,
                &words,
                (room / 8).min(250),
            )));
        }
        if blocks.is_empty() {
            blocks.push(Block::Prose(channel.escape_prose("(no output)")));
        }
        let segments = pack(channel, &blocks, limit);
        (segments, cut_attachments, kept, truncated)
    };
    // An attempt fits when every block found room and the messages are few enough.
    let fits = |segments: &Option<Vec<Vec<Segment>>>| {
        segments
            .as_ref()
            .is_some_and(|m| m.len() <= options.max_messages)
    };

    let full: Vec<usize> = streams.iter().map(|s| s.display.chars().count()).collect();
    let mut result = attempt(&full);
    if !fits(&result.0) {
        // Room for output, in characters, shared out so that a short stream is shown whole
        // and the long ones share the rest; shrunk until the layout fits.
        let zero = vec![0; streams.len()];
        let fixed: usize = attempt(&zero)
            .0
            .iter()
            .flatten()
            .flatten()
            .map(seg_len)
            .sum();
        let total = limit
            .unwrap_or(usize::MAX / 4)
            .saturating_mul(options.max_messages);
        let mut room = total.saturating_sub(fixed);
        let mut fitted = false;
        let mut too_much = room;
        for _ in 0..80 {
            let keep = share(&full, room);
            result = attempt(&keep);
            if fits(&result.0) {
                fitted = true;
                break;
            }
            too_much = room;
            room = room * 7 / 8;
            if room < 8 {
                break;
            }
        }
        // Then as much as fits between what fitted and what did not.
        while fitted && too_much - room > 16 {
            let mid = room + (too_much - room) / 2;
            let candidate = attempt(&share(&full, mid));
            if fits(&candidate.0) {
                room = mid;
                result = candidate;
            } else {
                too_much = mid;
            }
        }
        if !fitted {
            result = attempt(&zero);
            // The words alone overflow (a small max_chars and many attachments): keep the
            // first messages; every stream is attached.
            if let Some(m) = &mut result.0 {
                m.truncate(options.max_messages);
            }
        }
    }
    let (segments, cut_attachments, kept, truncated) = result;
    // Prose alone always finds room (a message takes any prose), so only an attempt with
    // output can come back without messages, and the attempt with none stands in.
    let segments = segments.unwrap_or_default();
    attachments.extend(cut_attachments);
    let messages = segments
        .iter()
        .map(|m| render_segments(channel, m))
        .collect();
    Layout {
        formatted: Formatted {
            channel,
            messages,
            attachments,
            truncated,
        },
        streams,
        kept,
        segments,
    }
}

/// `room` characters shared among streams of these lengths: each gets at most its length,
/// the rest is shared equally among the longer ones.
fn share(lengths: &[usize], room: usize) -> Vec<usize> {
    let mut keep = vec![0; lengths.len()];
    let mut left = room;
    let mut open: Vec<usize> = (0..lengths.len()).filter(|&i| lengths[i] > 0).collect();
    while !open.is_empty() && left > 0 {
        let each = (left / open.len()).max(1);
        let mut next = Vec::new();
        for &i in &open {
            let give = each.min(lengths[i] - keep[i]).min(left);
            keep[i] += give;
            left -= give;
            if keep[i] < lengths[i] {
                next.push(i);
            }
        }
        open = next;
    }
    keep
}

fn seg_len(s: &Segment) -> usize {
    match s {
        Segment::Prose(p) => utf16_len(p) + 1,
        Segment::Code { .. } => 16,
    }
}

fn code_piece_cost(channel: Channel, text: &str) -> usize {
    let mut chars = text.chars().peekable();
    let mut cost = 0;
    while let Some(c) = chars.next() {
        cost += channel.code_cost(c, chars.peek().copied());
    }
    cost
}

/// Lays blocks out into messages of at most `limit` UTF-16 units; None when a code block
/// cannot take one character even in a message of its own (its fences alone fill it).
fn pack(channel: Channel, blocks: &[Block], limit: Option<usize>) -> Option<Vec<Vec<Segment>>> {
    let limit = limit.unwrap_or(usize::MAX / 4);
    let mut messages: Vec<Vec<Segment>> = vec![Vec::new()];
    let mut used = 0usize;
    // A newline between segments of one message.
    let sep = |used: usize| usize::from(used > 0);
    for block in blocks {
        match block {
            Block::Prose(p) => {
                let need = utf16_len(p);
                if used > 0 && used + 1 + need > limit {
                    messages.push(Vec::new());
                    used = 0;
                }
                used += sep(used) + need;
                messages.last_mut().unwrap().push(Segment::Prose(p.clone()));
            }
            Block::Code {
                stream,
                lang,
                fence,
                text,
            } => {
                let (open, close) = channel.fences(lang.as_deref(), *fence);
                // The text's end: U+2060 where it does not end a line.
                let overhead = utf16_len(&open) + utf16_len(&close) + 1;
                let mut rest = text.as_str();
                while !rest.is_empty() {
                    let room = limit.saturating_sub(used + sep(used) + overhead);
                    let take = match fit(channel, rest, room) {
                        Some((n, true)) => n,
                        // A line split only in a message of its own.
                        Some((n, false)) if used == 0 => n,
                        _ if used > 0 => {
                            messages.push(Vec::new());
                            used = 0;
                            continue;
                        }
                        // Not one character fits in an empty message: the fences are too
                        // long for the limit (a long backtick run shown); less must be shown.
                        _ => return None,
                    };
                    let piece = &rest[..take];
                    used += sep(used) + overhead + code_piece_cost(channel, piece);
                    messages.last_mut().unwrap().push(Segment::Code {
                        stream: *stream,
                        lang: lang.clone(),
                        fence: *fence,
                        text: piece.to_string(),
                    });
                    rest = &rest[take..];
                }
            }
        }
    }
    messages.retain(|m| !m.is_empty());
    Some(messages)
}

/// The longest head of `text` that costs at most `room` sent: Some((bytes, true)) when it
/// ends at a line boundary (or is all of `text`), Some((bytes, false)) when it had to
/// stop inside a line, None when not one character fits.
fn fit(channel: Channel, text: &str, room: usize) -> Option<(usize, bool)> {
    let mut cost = 0;
    let mut last_line_end = None;
    let mut end = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|&(_, n)| n);
        let c_cost = channel.code_cost(c, next);
        if cost + c_cost > room {
            break;
        }
        cost += c_cost;
        end = i + c.len_utf8();
        if c == '\n' {
            last_line_end = Some(end);
        }
    }
    if end == text.len() {
        return Some((end, true));
    }
    match last_line_end {
        Some(n) => Some((n, true)),
        None if end > 0 => Some((end, false)),
        None => None,
    }
}

/// U+2060 WORD JOINER: invisible; ends a block whose text does not end a line.
const JOINER: char = '\u{2060}';

/// A block's text before its closing fence, which starts a line: the text's final newline
/// is the fence's, and a text that does not end a line (a line cut, output without a
/// final newline) ends with U+2060 instead, which [`unend_line`] reverses.
fn end_line(text: &str) -> String {
    match text.strip_suffix('\n') {
        Some(body) if !body.ends_with(JOINER) => body.to_string(),
        _ => format!("{text}{JOINER}"),
    }
}

/// The reverse of [`end_line`].
#[cfg(test)]
pub(crate) fn unend_line(body: &str) -> String {
    match body.strip_suffix(JOINER) {
        Some(text) => text.to_string(),
        None => format!("{body}\n"),
    }
}

fn render_segments(channel: Channel, segments: &[Segment]) -> String {
    let mut out = String::new();
    for (i, seg) in segments.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        match seg {
            Segment::Prose(p) => out.push_str(p),
            Segment::Code {
                lang, fence, text, ..
            } => {
                let (open, close) = channel.fences(lang.as_deref(), *fence);
                out.push_str(&open);
                if channel == Channel::Telegram {
                    out.push_str(&channel.escape_code(text));
                } else {
                    out.push_str(&channel.escape_code(&end_line(text)));
                }
                out.push_str(&close);
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The code bodies of a message as the channel reads them, decoded; panics where the
    /// message is not valid for its channel (unbalanced fences or tags, a bare `&`, `<`,
    /// `>` where entities are required, a message over the limit or empty).
    pub(crate) fn bodies(channel: Channel, message: &str, limit: Option<usize>) -> Vec<String> {
        assert!(!message.trim().is_empty(), "an empty message");
        if let Some(limit) = limit {
            assert!(
                utf16_len(message) <= limit,
                "{} > {limit}: {message:?}",
                utf16_len(message)
            );
        }
        match channel {
            Channel::Discord | Channel::Slack | Channel::Whatsapp => {
                if channel == Channel::Slack {
                    check_entities(message);
                    assert!(
                        !message.contains(['<', '>']),
                        "a bare < or > in {message:?}"
                    );
                }
                let parts: Vec<&str> = message.split("```").collect();
                assert!(parts.len() % 2 == 1, "unbalanced fences in {message:?}");
                parts
                    .iter()
                    .skip(1)
                    .step_by(2)
                    .map(|inside| {
                        let (_lang, body) = inside.split_once('\n').expect("a fence line");
                        let body = body
                            .strip_suffix('\n')
                            .expect("a closing fence on its own line");
                        let body = if channel == Channel::Slack {
                            html_unescape(body)
                        } else {
                            body.to_string()
                        };
                        unend_line(&unbreak_backticks(&body))
                    })
                    .collect()
            }
            Channel::Telegram => telegram_bodies(message),
            Channel::Markdown => markdown_bodies(message),
            Channel::Plain => panic!("plain text has no markup to read back"),
        }
    }

    fn check_entities(text: &str) {
        for (i, _) in text.match_indices('&') {
            let rest = &text[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;"]
                    .iter()
                    .any(|e| rest.starts_with(e)),
                "a bare & at {i} in {text:?}"
            );
        }
    }

    fn html_unescape(text: &str) -> String {
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&")
    }

    fn telegram_bodies(message: &str) -> Vec<String> {
        check_entities(message);
        let mut stack: Vec<&str> = Vec::new();
        let mut bodies = Vec::new();
        let mut body = String::new();
        let mut rest = message;
        while let Some(lt) = rest.find(['<', '>']) {
            let (text, tail) = rest.split_at(lt);
            assert!(tail.starts_with('<'), "a bare > in {message:?}");
            if stack.contains(&"pre") {
                body.push_str(text);
            }
            let gt = tail.find('>').expect("an unclosed tag");
            let tag = &tail[..=gt];
            match tag {
                "<pre>" | "<b>" => stack.push(&tag[1..tag.len() - 1]),
                t if t.starts_with("<code class=\"language-") && stack.last() == Some(&"pre") => {
                    stack.push("code")
                }
                "</pre>" | "</b>" | "</code>" => {
                    let name = &tag[2..tag.len() - 1];
                    assert_eq!(stack.pop(), Some(name), "unbalanced {tag} in {message:?}");
                    if name == "pre" {
                        bodies.push(html_unescape(&std::mem::take(&mut body)));
                    }
                }
                t => panic!("a tag Telegram does not take: {t} in {message:?}"),
            }
            rest = &tail[gt + 1..];
        }
        assert!(stack.is_empty(), "unclosed {stack:?} in {message:?}");
        bodies
    }

    fn markdown_bodies(message: &str) -> Vec<String> {
        let mut bodies = Vec::new();
        let mut open: Option<(String, Vec<&str>)> = None;
        for line in message.split('\n') {
            match &mut open {
                None => {
                    let run = line.chars().take_while(|&c| c == '`').count();
                    if run >= 3 {
                        assert!(
                            !line[run..].contains('`'),
                            "a backtick in an info string: {line:?}"
                        );
                        open = Some((line[..run].to_string(), Vec::new()));
                    } else {
                        assert!(!line.starts_with("``"), "stray backticks: {line:?}");
                    }
                }
                Some((fence, lines)) => {
                    if line == fence.as_str() {
                        bodies.push(unend_line(&lines.join("\n")));
                        open = None;
                    } else {
                        assert!(
                            !line.starts_with(fence.as_str()),
                            "a fence inside a block: {line:?}"
                        );
                        lines.push(line);
                    }
                }
            }
        }
        assert!(open.is_none(), "an unclosed fence in {message:?}");
        bodies
    }

    /// Every property the issue asks of a rendering, for any input.
    pub(crate) fn check(input: &Input, options: &Options) -> Layout {
        let layout = lay_out(input, options);
        let f = &layout.formatted;
        let limit = options.limit();
        assert!(!f.messages.is_empty() && f.messages.len() <= options.max_messages);
        assert_eq!(f.messages.len(), layout.segments.len());
        // What the messages show of each stream, read back from the messages.
        let shown: String = if options.channel == Channel::Plain {
            for m in &f.messages {
                assert!(!m.trim().is_empty());
                if let Some(limit) = limit {
                    assert!(utf16_len(m) <= limit);
                }
            }
            layout
                .segments
                .iter()
                .flatten()
                .filter_map(|s| match s {
                    Segment::Code { text, .. } => Some(text.as_str()),
                    _ => None,
                })
                .collect()
        } else {
            f.messages
                .iter()
                .flat_map(|m| bodies(options.channel, m, limit))
                .collect()
        };
        let expected: String = layout
            .streams
            .iter()
            .zip(&layout.kept)
            .map(|(s, r)| &s.display[r.clone()])
            .collect();
        assert_eq!(shown, expected);
        let mut any_cut = false;
        for (s, r) in layout.streams.iter().zip(&layout.kept) {
            let whole = r.len() == s.display.len();
            any_cut |= !whole;
            if s.keep_tail {
                assert_eq!(r.end, s.display.len());
            } else {
                assert_eq!(r.start, 0);
            }
            if !whole || s.display.as_bytes() != s.raw.as_slice() {
                let a = f
                    .attachments
                    .iter()
                    .find(|a| a.data == s.raw && a.name.ends_with(".txt"))
                    .unwrap_or_else(|| panic!("{} was cut or altered and is not attached", s.name));
                assert_eq!(a.size, s.raw.len() as u64);
            }
        }
        assert_eq!(f.truncated, any_cut);
        // A cut says so, naming the file that holds the rest.
        for (s, r) in layout.streams.iter().zip(&layout.kept) {
            if r.len() < s.display.len() {
                let a = f.attachments.iter().find(|a| a.data == s.raw).unwrap();
                assert!(
                    f.messages
                        .iter()
                        .any(|m| m.contains(&format!("attached as {}", a.name))),
                    "{} was cut without a word: {:?}",
                    s.name,
                    f.messages
                );
            }
        }
        layout
    }

    fn outcome(stdout: &str, stderr: &str) -> Outcome {
        Outcome {
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            exit_code: Some(0),
            ..Outcome::default()
        }
    }

    #[test]
    fn a_channel_is_named_and_an_unknown_one_is_refused_with_the_allowed_names() {
        assert_eq!("Telegram".parse::<Channel>(), Ok(Channel::Telegram));
        let e = "teams".parse::<Channel>().unwrap_err().to_string();
        assert!(
            e.contains("\"teams\"")
                && e.contains("discord, telegram, slack, whatsapp, markdown, plain"),
            "{e}"
        );
        assert_eq!(serde_json::to_value(Channel::Whatsapp).unwrap(), "whatsapp");
        let mut o = Options::new(Channel::Discord);
        o.max_messages = 0;
        assert!(o.validate().unwrap_err().0.contains("max_messages 0"));
        o.max_messages = 1;
        o.language = Some("py\n```".into());
        assert!(o.validate().unwrap_err().0.contains("language"));
        o.language = None;
        o.max_chars = Some(10);
        assert!(o.validate().unwrap_err().0.contains("at least 1000"));
    }

    #[test]
    fn a_request_names_a_channel_or_gives_options_and_bad_ones_are_refused_by_name() {
        let read = |json: &str| serde_json::from_str::<FormatRequest>(json);
        assert_eq!(
            read(r#""slack""#).unwrap().options().unwrap(),
            Options::new(Channel::Slack)
        );
        let o = read(r#"{"channel": "discord", "max_messages": 3, "language": "python"}"#)
            .unwrap()
            .options()
            .unwrap();
        assert_eq!(
            (o.channel, o.max_messages, o.language.as_deref()),
            (Channel::Discord, 3, Some("python"))
        );
        let e = read(r#""teams""#).unwrap_err().to_string();
        assert!(
            e.contains("give one of discord, telegram, slack, whatsapp, markdown, plain"),
            "{e}"
        );
        let e = read(r#"{"channel": "teams"}"#).unwrap_err().to_string();
        assert!(e.contains("discord"), "{e}");
        let e = read("3").unwrap_err().to_string();
        assert!(e.contains("a channel (discord,"), "{e}");
        assert!(read(r#"{"channel": "discord", "colour": true}"#).is_err());
        let e = read(r#"{"channel": "discord", "max_messages": 500}"#)
            .unwrap()
            .options()
            .unwrap_err();
        assert!(
            e.0.contains("max_messages 500: give a number from 1 to 100"),
            "{e}"
        );
    }

    #[test]
    fn a_short_result_is_one_message_with_nothing_attached() {
        let mut o = Options::new(Channel::Discord);
        o.language = Some("python".into());
        let f = render(&outcome("hi\n", "warn\n"), &o).unwrap();
        assert_eq!(
            f.messages,
            ["```python\nhi\n```\n**stderr:**\n```\nwarn\n```"]
        );
        assert!(f.attachments.is_empty() && !f.truncated);
    }

    #[test]
    fn a_long_output_is_cut_at_a_line_and_attached_whole() {
        let stdout: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        let out = outcome(&stdout, "");
        for channel in Channel::ALL {
            let mut o = Options::new(channel);
            o.max_chars = channel.limit().is_none().then_some(2000);
            let layout = check(&(&out).into(), &o);
            let f = layout.formatted;
            assert!(f.truncated, "{channel}");
            let kept = &layout.streams[0].display[layout.kept[0].clone()];
            assert!(kept.ends_with('\n'), "{channel}: cut inside a line");
            let left = 3000 - kept.lines().count();
            let words = format!(
                "… {} more lines, full output attached as output.txt",
                grouped(left)
            );
            let said = f.messages[0].replace('\\', "");
            assert!(said.contains(&words), "{channel}: {said}");
            assert_eq!(f.attachments[0].name, "output.txt");
            assert_eq!(f.attachments[0].data, stdout.as_bytes());
        }
    }

    #[test]
    fn more_messages_hold_more_and_each_stays_within_the_limit() {
        let stdout: String = (0..400).map(|i| format!("{i} <&> `` ```\n")).collect();
        let out = outcome(&stdout, "");
        for channel in Channel::ALL {
            let mut o = Options::new(channel);
            o.max_messages = 10;
            o.max_chars = channel.limit().is_none().then_some(1500);
            let layout = check(&(&out).into(), &o);
            assert!(
                !layout.formatted.truncated,
                "{channel}: {} messages",
                layout.formatted.messages.len()
            );
            assert!(layout.formatted.messages.len() > 1);
        }
    }

    #[test]
    fn one_huge_line_is_cut_at_a_character_boundary() {
        let line = "é😀<".repeat(5000);
        let out = outcome(&line, "");
        for channel in Channel::ALL {
            let mut o = Options::new(channel);
            o.max_chars = channel.limit().is_none().then_some(1000);
            let f = check(&(&out).into(), &o).formatted;
            assert!(f.truncated);
            assert!(
                f.messages[0].contains("more characters, full output attached as output.txt"),
                "{}",
                f.messages[0]
            );
        }
    }

    #[test]
    fn a_mebibyte_of_output_renders_into_as_many_messages_as_asked() {
        let stdout: String = (0..80_000).map(|i| format!("{i:>12}\n")).collect();
        let out = outcome(&stdout, &"warning: <x> & y\n".repeat(2000));
        for (channel, max_messages) in [(Channel::Telegram, 1), (Channel::Discord, 20)] {
            let mut o = Options::new(channel);
            o.max_messages = max_messages;
            let f = check(&(&out).into(), &o).formatted;
            assert!(f.truncated);
            assert_eq!(f.messages.len(), max_messages, "{channel}");
        }
    }

    #[test]
    fn colours_are_left_out_and_the_exact_bytes_attached() {
        assert_eq!(
            display_text(b"\x1b[1;31mred\x1b[0m\r\n10%\r50%\r100%\nbell\x07\n"),
            "red\n100%\nbell\n"
        );
        let out = outcome("\x1b[32mok\x1b[0m\n", "");
        let f = check(&(&out).into(), &Options::new(Channel::Telegram)).formatted;
        assert!(!f.truncated);
        assert_eq!(f.attachments[0].data, b"\x1b[32mok\x1b[0m\n");
        assert!(
            f.messages[0].contains("<pre>ok\n</pre>"),
            "{}",
            f.messages[0]
        );
    }

    #[test]
    fn an_empty_result_still_says_something() {
        for channel in Channel::ALL {
            let f = render(&Outcome::default(), &Options::new(channel)).unwrap();
            assert_eq!(f.messages.len(), 1);
            assert!(
                f.messages[0].contains("no output"),
                "{channel}: {:?}",
                f.messages
            );
        }
    }

    #[test]
    fn backticks_and_entities_in_output_stay_inside_their_block() {
        let out = outcome("```\n</code></pre><b>&amp;\n`\u{200b}`", "");
        for channel in Channel::ALL {
            let mut o = Options::new(channel);
            o.language = Some("python".into());
            let layout = check(&(&out).into(), &o);
            assert!(!layout.formatted.truncated);
        }
    }

    /// Found by the property below (1 case in about 21 000): a backtick run longer than
    /// half the limit. Its part that fits gets a fence longer than the run it shows.
    #[test]
    fn a_backtick_run_longer_than_half_the_limit_is_cut_and_fenced_by_what_is_shown() {
        let out = outcome(&"`".repeat(865), "");
        for channel in Channel::ALL {
            let o = Options {
                channel,
                max_messages: 1,
                language: Some("++".into()),
                max_chars: Some(1000),
            };
            let layout = check(&(&out).into(), &o);
            // max_chars is markdown's and plain's limit; the chat channels' own fit it.
            if channel == Channel::Markdown {
                assert!(layout.formatted.truncated);
            }
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::tests::check;
    use super::*;

    /// Output as hostile as output gets for a chat: markup of every channel, fences,
    /// entities, zero-width spaces, escapes, emoji (two UTF-16 units), long lines, none.
    fn output() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(Vec::new()),
            ".{0,200}".prop_map(String::into_bytes),
            "[`<>&;a-z \\n\u{200b}é😀\t\r\u{1b}\\[m*_~|#]{0,3000}".prop_map(String::into_bytes),
            ("[a-z<&`😀]{1,4}", 100usize..3000).prop_map(|(s, n)| s.repeat(n).into_bytes()),
            proptest::collection::vec(
                prop_oneof![
                    "```[a-z]{0,6}\n",
                    "</code></pre>",
                    "&amp;",
                    "<b>",
                    "\n",
                    "[a-z ]{0,80}\n"
                ],
                0..200
            )
            .prop_map(|parts| parts.concat().into_bytes()),
            proptest::collection::vec(any::<u8>(), 0..600),
        ]
    }

    fn options() -> impl Strategy<Value = Options> {
        (
            0..Channel::ALL.len(),
            1usize..5,
            proptest::option::of("[a-z+#]{1,8}"),
            proptest::option::of(MIN_CHARS..5000),
        )
            .prop_map(|(c, max_messages, language, max_chars)| Options {
                channel: Channel::ALL[c],
                max_messages,
                language,
                max_chars,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn every_message_fits_its_channel_and_messages_with_attachments_hold_the_whole_output(
            stdout in output(),
            stderr in output(),
            options in options(),
        ) {
            let outcome = Outcome { stdout, stderr, exit_code: Some(1), ..Outcome::default() };
            check(&(&outcome).into(), &options);
        }

        #[test]
        fn a_call_with_a_result_and_an_exception_holds_them_too(
            stdout in output(),
            result in ".{0,2000}",
            value in ".{0,600}",
            traceback in proptest::collection::vec(".{0,300}\n", 0..30),
            options in options(),
        ) {
            let call = CallOutcome {
                outcome: Outcome { stdout, error: Some(ErrorKind::Exception), ..Outcome::default() },
                execution_count: Some(1),
                result: Some([("text/plain".to_string(), result)].into()),
                displays: Vec::new(),
                exception: Some(Exception { name: "ValueError".into(), value, traceback }),
                state: Default::default(),
                cwd: None,
                killed: Vec::new(),
            };
            check(&(&call).into(), &options);
        }
    }
}

/// The expected renderings, in tests/golden/format/SCENARIO.CHANNEL.txt (`UPDATE_GOLDEN=1`
/// writes them; read the diff before committing it).
#[cfg(test)]
mod golden {
    use super::tests::check;
    use super::*;

    /// A 2x2 PNG, as matplotlib's driver sends a figure (base64 in a display's bundle).
    pub(crate) const PNG: &str =
        "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAADklEQVR4nGP4zwAEcAIAGvQC/v0BV80AAAAASUVORK5CYII=";

    /// `print(df)` of a 60-row frame: longer than Discord's and Slack's limits.
    fn pandas_table() -> Outcome {
        let mut out = String::from("    city        country  population  area_km2  density\n");
        let cities = [
            ("Tokyo", "Japan", 37_400_068, 2_191),
            ("Delhi", "India", 28_514_000, 1_484),
            ("Shanghai", "China", 25_582_000, 6_341),
            ("São Paulo", "Brazil", 21_650_000, 1_521),
            ("México", "Mexico", 21_581_000, 1_485),
        ];
        for i in 0..60 {
            let (city, country, pop, area) = cities[i % cities.len()];
            let pop = pop - i * 1_000;
            out.push_str(&format!(
                "{i:<3} {city:<11} {country:<7} {pop:>11} {area:>9} {:>8.1}\n",
                pop as f64 / area as f64
            ));
        }
        out.push_str("\n[60 rows x 5 columns]\n");
        Outcome {
            stdout: out.into_bytes(),
            exit_code: Some(0),
            ..Outcome::default()
        }
    }

    /// `python main.py` that fails: a traceback on stderr (with `<module>`), exit 1.
    fn traceback() -> Outcome {
        let stderr = "Traceback (most recent call last):\n  File \"/work/main.py\", line 4, in <module>\n    print(ratio(3, 0))\n          ^^^^^^^^^^^\n  File \"/work/main.py\", line 2, in ratio\n    return a / b\n           ~~^~~\nZeroDivisionError: division by zero\n";
        Outcome {
            stdout: b"computing ratios & totals...\n".to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            exit_code: Some(1),
            ..Outcome::default()
        }
    }

    /// A session call that plotted: `plt.plot(...); plt.show()` in a cell.
    fn figure() -> CallOutcome {
        let bundle: MimeBundle = [
            ("image/png".to_string(), PNG.to_string()),
            (
                "text/plain".to_string(),
                "<Figure size 640x480 with 1 Axes>".to_string(),
            ),
        ]
        .into();
        CallOutcome {
            outcome: Outcome {
                stdout: b"mean=2.5 *peak* at x_max\n".to_vec(),
                ..Outcome::default()
            },
            execution_count: Some(3),
            result: None,
            displays: vec![bundle],
            exception: None,
            state: Default::default(),
            cwd: None,
            killed: Vec::new(),
        }
    }

    /// A session call whose cell raised, with a trailing value before it and a file out.
    fn call_exception() -> CallOutcome {
        CallOutcome {
            outcome: Outcome {
                stdout: b"loading rows_2024.csv\n".to_vec(),
                error: Some(ErrorKind::Exception),
                files: vec![OutputFile {
                    path: "partial.csv".into(),
                    size: 9,
                    media_type: "text/csv".into(),
                    sha256: String::new(),
                    data: Some(b"a,b\n1,2\n".to_vec()),
                }],
                ..Outcome::default()
            },
            execution_count: Some(4),
            result: None,
            displays: Vec::new(),
            exception: Some(Exception {
                name: "KeyError".into(),
                value: "'price_<usd>'".into(),
                traceback: vec![
                    "Traceback (most recent call last):\n".into(),
                    "  File \"<cell 4>\", line 2, in <module>\n".into(),
                    "    total = df['price_<usd>'].sum()\n".into(),
                    "KeyError: 'price_<usd>'\n".into(),
                ],
            }),
            state: Default::default(),
            cwd: None,
            killed: Vec::new(),
        }
    }

    /// A run that timed out after some output.
    fn timeout() -> Outcome {
        Outcome {
            stdout: b"epoch 1 loss=0.93\nepoch 2 loss=0.71\n".to_vec(),
            signal: Some(9),
            error: Some(ErrorKind::Timeout),
            message: Some("the run passed its 30 s limit and was killed; ask for a longer --timeout (up to the profile's 120 s) or do less".into()),
            ..Outcome::default()
        }
    }

    /// A rendering as a file: each message between markers, then each attachment.
    fn show(f: &Formatted) -> String {
        let mut out = String::new();
        let n = f.messages.len();
        for (i, m) in f.messages.iter().enumerate() {
            out.push_str(&format!(
                "===== message {} of {n} ({} UTF-16 units) =====\n{m}\n",
                i + 1,
                utf16_len(m)
            ));
        }
        for a in &f.attachments {
            out.push_str(&format!(
                "===== attachment {} ({}, {} bytes, sha256 {})\n",
                a.name, a.media_type, a.size, a.sha256
            ));
        }
        out.push_str(&format!("===== truncated: {}\n", f.truncated));
        out
    }

    fn compare(scenario: &str, input: &Input, language: Option<&str>) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/format");
        let mut failures = Vec::new();
        for channel in Channel::ALL {
            let mut options = Options::new(channel);
            options.language = language.map(str::to_string);
            let got = show(&check(input, &options).formatted);
            let path = dir.join(format!("{scenario}.{channel}.txt"));
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &got).unwrap();
                continue;
            }
            let want = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
            if got != want {
                failures.push(format!(
                    "{}:\n--- want\n{want}\n--- got\n{got}",
                    path.display()
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn golden_pandas_table() {
        compare("pandas_table", &(&pandas_table()).into(), None);
    }

    #[test]
    fn golden_traceback() {
        compare("traceback", &(&traceback()).into(), Some("python"));
    }

    #[test]
    fn golden_call_exception() {
        compare(
            "call_exception",
            &(&call_exception()).into(),
            Some("python"),
        );
    }

    #[test]
    fn golden_timeout() {
        compare("timeout", &(&timeout()).into(), None);
    }

    #[test]
    fn golden_figure() {
        compare("figure", &(&figure()).into(), Some("python"));
    }
}
