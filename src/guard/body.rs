//! A response body passed through [`scan`]: a whole document at once, or a
//! watch line by line as the lines arrive.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::scan::{Shape, ShapeCheck, Skipped, scan};

/// Any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a response's body needs: its shape, the shape check of its
/// resource, and where to say what was left out.
#[derive(Clone)]
pub(crate) struct Reading {
    /// How the body is laid out.
    pub shape: Shape,
    /// The check of the resource's objects, if it has one.
    pub check: Option<Arc<ShapeCheck>>,
    /// Told of every object left out.
    pub on_skip: Arc<dyn Fn(Skipped) + Send + Sync>,
}

impl Reading {
    fn pass(&self, document: &[u8]) -> Bytes {
        let scanned = scan(document, self.shape, self.check.as_deref());
        for skipped in scanned.skipped {
            (self.on_skip)(skipped);
        }
        Bytes::from(scanned.bytes)
    }
}

/// A response body, scanned before anyone decodes it.
pub struct GuardedBody<B> {
    inner: Pin<Box<B>>,
    mode: Mode,
}

enum Mode {
    /// Not JSON, or not a success: as it comes.
    Pass,
    /// One document: collected, then scanned.
    Whole { reading: Reading, buffer: BytesMut },
    /// A watch: each complete line scanned as it arrives.
    Lines { reading: Reading, pending: BytesMut },
    /// Everything was sent.
    Done,
}

impl<B> GuardedBody<B> {
    /// The body as it comes.
    pub(crate) fn pass(inner: B) -> Self {
        Self {
            inner: Box::pin(inner),
            mode: Mode::Pass,
        }
    }

    /// The body scanned as `reading` says.
    pub(crate) fn scanned(inner: B, reading: Reading) -> Self {
        let mode = match reading.shape {
            Shape::Events => Mode::Lines {
                reading,
                pending: BytesMut::new(),
            },
            Shape::Object | Shape::List => Mode::Whole {
                reading,
                buffer: BytesMut::new(),
            },
        };
        Self {
            inner: Box::pin(inner),
            mode,
        }
    }
}

/// The complete lines at the front of `pending`, each scanned, with their
/// line ends; `None` while no line is complete.
fn complete_lines(reading: &Reading, pending: &mut BytesMut) -> Option<Bytes> {
    let end = pending.iter().rposition(|b| *b == b'\n')? + 1;
    let lines = pending.split_to(end);
    let mut out = BytesMut::with_capacity(lines.len());
    for line in lines[..].split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        out.extend_from_slice(&reading.pass(line));
        out.extend_from_slice(b"\n");
    }
    Some(out.freeze())
}

impl<B> Body for GuardedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Mode::Lines { reading, pending } = &mut this.mode
                && let Some(lines) = complete_lines(reading, pending)
                && !lines.is_empty()
            {
                return Poll::Ready(Some(Ok(Frame::data(lines))));
            }
            if matches!(this.mode, Mode::Done) {
                return Poll::Ready(None);
            }
            let polled = ready!(this.inner.as_mut().poll_frame(cx));
            let frame = match (&mut this.mode, polled) {
                (_, Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                (Mode::Pass, polled) => return Poll::Ready(polled.map(|f| f.map_err(Into::into))),
                (_, Some(Ok(frame))) => frame,
                (mode, None) => {
                    let last = match std::mem::replace(mode, Mode::Done) {
                        Mode::Whole { reading, buffer } => reading.pass(&buffer),
                        Mode::Lines {
                            reading,
                            mut pending,
                        } => {
                            pending.extend_from_slice(b"\n");
                            complete_lines(&reading, &mut pending).unwrap_or_default()
                        }
                        Mode::Pass | Mode::Done => Bytes::new(),
                    };
                    if last.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(last))));
                }
            };
            match (&mut this.mode, frame.into_data()) {
                (Mode::Whole { buffer, .. }, Ok(data)) => buffer.extend_from_slice(&data),
                (Mode::Lines { pending, .. }, Ok(data)) => pending.extend_from_slice(&data),
                // Trailers: the API server sends none; nothing to scan.
                _ => {}
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.mode {
            Mode::Pass => self.inner.is_end_stream(),
            Mode::Done => true,
            Mode::Whole { .. } | Mode::Lines { .. } => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.mode {
            Mode::Pass => self.inner.size_hint(),
            _ => SizeHint::default(),
        }
    }
}
