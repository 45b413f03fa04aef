//! A review's bytes while the webhook holds them: reserved by the length
//! the request announces ([`Budget`]), its body read within a deadline
//! that grows with that length (a client that stalls is dropped, and its
//! reservation with it), its answer handed to the connection a chunk at a
//! time, the reservation kept until the last chunk.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};

use super::budget::{Budget, Refused, Reservation, Rooms};

/// How long any body may take to arrive, whatever its length: the API
/// server writes a review it holds whole right after its headers.
const BODY_BASE: Duration = Duration::from_secs(2);
/// The slowest a body may arrive, in bytes a second, beyond
/// [`BODY_BASE`]: a thirtieth of a 1 Gbit/s link, slower than any API
/// server writes over a cluster's network; the largest review then has
/// 4 s.
const BODY_RATE: u32 = 4 << 20;
/// The chunks an answer is handed to the connection in: as much as the
/// connection buffers (`server::BUFFER`), so that it holds no more of an
/// answer than that while the reservation is counted.
pub const CHUNK: usize = 64 << 10;

/// How long a body may take to arrive: a base and a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// How long any body may take.
    pub base: Duration,
    /// The slowest it may arrive beyond that, in bytes a second.
    pub rate: u32,
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            base: BODY_BASE,
            rate: BODY_RATE,
        }
    }
}

impl Pace {
    /// How long a body of `bytes` may take to arrive.
    pub fn deadline(&self, bytes: u32) -> Duration {
        let rate = f64::from(self.rate.max(1));
        self.base + Duration::from_secs_f64(f64::from(bytes) / rate)
    }
}

/// Why a review was not taken in.
#[derive(Debug, thiserror::Error)]
pub enum NotTaken {
    /// Refused before its body was read.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// Its body did not arrive in time.
    #[error("the review's body did not arrive within {} ms", .0.as_millis())]
    Late(Duration),
    /// Its body ended before its announced length, or went on past it.
    #[error("the review's body is not the length it announced: {0}")]
    Broken(String),
}

/// Takes reviews in: reserves them, reads them.
#[derive(Debug, Clone)]
pub struct Intake {
    budget: Budget,
    pace: Pace,
}

impl Intake {
    /// Reserving from rooms of `rooms`' sizes, reading at `pace`.
    pub fn new(rooms: Rooms, pace: Pace) -> Self {
        Self {
            budget: Budget::new(rooms),
            pace,
        }
    }

    /// The body of a request of `headers`, read whole, and its reservation.
    pub async fn take<B>(
        &self,
        headers: &HeaderMap,
        body: B,
    ) -> Result<(Bytes, Reservation), NotTaken>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let reservation = self.budget.reserve(content_length(headers))?;
        let deadline = self.pace.deadline(reservation.bytes());
        let read = read(body, reservation.bytes());
        let body = (tokio::time::timeout(deadline, read).await)
            .map_err(|_| NotTaken::Late(deadline))??;
        Ok((body, reservation))
    }
}

/// The length a request announces, if it announces one.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    let length = values.next()?.to_str().ok()?.parse().ok();
    // Two lengths: none to trust (hyper refuses a conflicting pair first).
    values.next().is_none().then_some(length).flatten()
}

/// `body`, which announced `bytes`, read whole into one buffer of that
/// size (no copy of the whole at the end; pages are touched as it arrives).
async fn read<B>(body: B, bytes: u32) -> Result<Bytes, NotTaken>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let announced = bytes as usize;
    let mut body = std::pin::pin!(Limited::new(body, announced));
    let mut buffer = BytesMut::with_capacity(announced);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| NotTaken::Broken(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
    }
    if buffer.len() != announced {
        let read = buffer.len();
        return Err(NotTaken::Broken(format!(
            "{read} bytes of the {announced} announced"
        )));
    }
    Ok(buffer.freeze())
}

/// An answer, handed to the connection [`CHUNK`] by [`CHUNK`] while its
/// review's reservation is held.
#[derive(Debug)]
pub struct Answer {
    rest: Bytes,
    reservation: Option<Reservation>,
}

impl Answer {
    /// `answer` to the review reserved by `reservation`.
    pub fn new(answer: Vec<u8>, reservation: Reservation) -> Self {
        Self {
            rest: answer.into(),
            reservation: Some(reservation),
        }
    }
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.rest.is_empty() {
            self.reservation = None;
            return Poll::Ready(None);
        }
        let length = self.rest.len().min(CHUNK);
        let chunk = self.rest.split_to(length);
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{Full, StreamBody};

    use super::*;

    fn headers(length: Option<usize>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(length) = length {
            headers.insert(header::CONTENT_LENGTH, length.into());
        }
        headers
    }

    fn intake() -> Intake {
        let rooms = Rooms {
            small_max: 10,
            small: 20,
            large: 100,
        };
        let pace = Pace {
            base: Duration::from_millis(200),
            rate: 1_000,
        };
        Intake::new(rooms, pace)
    }

    #[test]
    fn a_bodys_deadline_grows_with_its_length() {
        let pace = Pace::default();
        assert_eq!(pace.deadline(0), Duration::from_secs(2));
        assert_eq!(pace.deadline(8 << 20), Duration::from_secs(4));
    }

    #[tokio::test]
    async fn a_body_is_read_whole_at_the_length_it_announced() {
        let intake = intake();
        let (body, reservation) =
            (intake.take(&headers(Some(5)), Full::from("hello")).await).expect("taken");
        assert_eq!(body, "hello");
        assert_eq!(reservation.bytes(), 5);
        let short = intake.take(&headers(Some(6)), Full::from("hello")).await;
        assert!(matches!(short, Err(NotTaken::Broken(_))), "{short:?}");
        let long = intake.take(&headers(Some(4)), Full::from("hello")).await;
        assert!(matches!(long, Err(NotTaken::Broken(_))), "{long:?}");
        let unknown = intake.take(&headers(None), Full::from("hello")).await;
        let refused = unknown.unwrap_err();
        assert!(
            matches!(refused, NotTaken::Refused(Refused::NoLength)),
            "{refused}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_is_dropped_at_its_deadline_and_frees_its_room() {
        let intake = intake();
        let stalled =
            StreamBody::new(futures::stream::pending::<Result<Frame<Bytes>, Infallible>>());
        let late = intake.take(&headers(Some(100)), stalled).await.unwrap_err();
        assert!(
            matches!(late, NotTaken::Late(d) if d == Duration::from_millis(300)),
            "{late}"
        );
        let again = (intake.take(&headers(Some(100)), Full::from(vec![b' '; 100]))).await;
        assert!(again.is_ok(), "the room is free again");
    }

    #[tokio::test]
    async fn an_answer_goes_out_in_chunks_and_frees_its_room_after_the_last() {
        let intake = intake();
        let (_, reservation) = (intake
            .take(&headers(Some(100)), Full::from(vec![b' '; 100]))
            .await)
            .unwrap();
        let mut answer = std::pin::pin!(Answer::new(vec![b'a'; CHUNK + 1], reservation));
        assert_eq!(answer.size_hint().exact(), Some(CHUNK as u64 + 1));
        let first = answer.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), CHUNK);
        let busy = intake
            .take(&headers(Some(100)), Full::from(vec![b' '; 100]))
            .await;
        assert!(
            matches!(busy, Err(NotTaken::Refused(Refused::Busy { .. }))),
            "{busy:?}"
        );
        let last = answer.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(last.len(), 1);
        assert!(answer.frame().await.is_none());
        let again = (intake.take(&headers(Some(100)), Full::from(vec![b' '; 100]))).await;
        assert!(again.is_ok(), "the room is free again");
    }
}
