//! Streamed answers (`Accept: application/x-ndjson`): events from the work's thread that
//! never wait for the reader (a bounded buffer, the rest dropped and counted), heartbeats,
//! and a final result or error event.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use codecage::outcome::encode_stream;
use codecage::Stream;

use super::ApiError;

use tokio_stream::StreamExt as _;
pub(super) fn wants_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/x-ndjson"))
}

/// One line of a streamed answer (`Accept: application/x-ndjson`): the output as it
/// comes, then the result (`R`: a run's `Outcome`, a call's `CallOutcome`) or an error.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum StreamEvent<R> {
    /// What the code wrote to stdout since the last event.
    Stdout {
        data: String,
        encoding: codecage::outcome::Encoding,
    },
    /// What the code wrote to stderr since the last event.
    Stderr {
        data: String,
        encoding: codecage::outcome::Encoding,
    },
    /// A MIME bundle a session's call showed (a figure, `display()`).
    Display {
        #[schema(value_type = codecage::session::MimeBundleSchema)]
        data: codecage::session::MimeBundle,
    },
    /// Output the stream did not carry because its reader fell behind (the result
    /// carries all of it, up to the output limit).
    Dropped { bytes: u64, events: u64 },
    /// The work could not give its result (a refusal found after the stream began, or a
    /// failure): the stream's last event.
    Error {
        /// The error's kind, as in an error answer's body.
        error: String,
        message: String,
    },
    /// The stream is alive (every 10 s while the work runs).
    Heartbeat,
    /// The result, whatever its verdict: the stream's last event.
    Result(Box<R>),
}

impl<R> StreamEvent<R> {
    pub(super) fn error(e: ApiError) -> StreamEvent<R> {
        StreamEvent::Error {
            error: e.kind().to_string(),
            message: e.message,
        }
    }
}

/// Bytes of events a stream holds for a slow reader; past it events are dropped and
/// counted, and the call goes on on its own clock.
const STREAM_BUFFER: usize = 1 << 20;

/// What a streamed call has queued for its reader and what it dropped.
#[derive(Default)]
struct Backlog {
    queued: AtomicUsize,
    dropped_bytes: AtomicU64,
    dropped_events: AtomicU64,
}

pub(super) fn output_event<R>(stream: Stream, bytes: &[u8]) -> StreamEvent<R> {
    let (encoding, data) = encode_stream(bytes);
    match stream {
        Stream::Stdout => StreamEvent::Stdout { data, encoding },
        Stream::Stderr => StreamEvent::Stderr { data, encoding },
    }
}

/// How often an idle stream says it is alive.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// The sending side of a streamed answer (NDJSON): events from the work's thread, which
/// never waits for the reader, then the final event.
pub(super) struct Events<R> {
    queue: tokio::sync::mpsc::Sender<(StreamEvent<R>, usize)>,
    backlog: Arc<Backlog>,
    /// Fired when the reader is gone: the work stops.
    stop: CancellationToken,
}

/// A streamed answer: the sender for the work, and the response whose body holds `stop`'s
/// drop guard (a client that goes drops the body, and the work is stopped).
pub(super) fn ndjson<R: Serialize + Send + 'static>(
    stop: CancellationToken,
) -> (Events<R>, Response) {
    let (queue, receiver) = tokio::sync::mpsc::channel::<(StreamEvent<R>, usize)>(1024);
    let backlog = Arc::new(Backlog::default());
    let events = Events {
        queue,
        backlog: backlog.clone(),
        stop: stop.clone(),
    };
    let guard = stop.drop_guard();
    let lines = tokio_stream::wrappers::ReceiverStream::new(receiver).map(move |(event, size)| {
        let _held = &guard;
        backlog.queued.fetch_sub(size, Ordering::AcqRel);
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    let body = axum::body::Body::from_stream(lines);
    let response = ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    (events, response)
}

impl<R> Clone for Events<R> {
    fn clone(&self) -> Self {
        Events {
            queue: self.queue.clone(),
            backlog: self.backlog.clone(),
            stop: self.stop.clone(),
        }
    }
}

impl<R: Serialize> Events<R> {
    /// On the work's thread: queued if the buffer has room, else dropped and counted; with
    /// the reader gone, the work is stopped.
    pub(super) fn push(&self, event: StreamEvent<R>) {
        let size = match &event {
            StreamEvent::Stdout { data, .. } | StreamEvent::Stderr { data, .. } => data.len(),
            _ => serde_json::to_vec(&event).map_or(0, |v| v.len()),
        };
        let dropped = |seen: &Backlog| {
            seen.dropped_bytes.fetch_add(size as u64, Ordering::Relaxed);
            seen.dropped_events.fetch_add(1, Ordering::Relaxed);
        };
        if self.backlog.queued.load(Ordering::Acquire) + size > STREAM_BUFFER {
            return dropped(&self.backlog);
        }
        match self.queue.try_send((event, size)) {
            Ok(()) => {
                self.backlog.queued.fetch_add(size, Ordering::AcqRel);
            }
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => dropped(&self.backlog),
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => self.stop.cancel(),
        }
    }

    /// Waits for the work's last event (with a heartbeat while it runs), then sends what
    /// was dropped, if anything, and that event.
    pub(super) async fn conclude(self, work: impl std::future::Future<Output = StreamEvent<R>>) {
        tokio::pin!(work);
        let mut beat = tokio::time::interval(HEARTBEAT);
        beat.tick().await;
        let last = loop {
            tokio::select! {
                last = &mut work => break last,
                _ = beat.tick() => self.push(StreamEvent::Heartbeat),
            }
        };
        let dropped = self.backlog.dropped_events.load(Ordering::Relaxed);
        if dropped > 0 {
            let bytes = self.backlog.dropped_bytes.load(Ordering::Relaxed);
            let event = StreamEvent::Dropped {
                bytes,
                events: dropped,
            };
            let _ = self.queue.send((event, 0)).await;
        }
        let _ = self.queue.send((last, 0)).await;
    }
}
