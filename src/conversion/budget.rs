//! What the webhook holds of its clients' reviews at once. Every review is
//! reserved, by the length its `Content-Length` announces, from one of two
//! rooms before a byte of its body is read; one that announces no length,
//! more than the largest review read, or more than its room has left now
//! is refused there and then (the API server retries a busy webhook, see
//! [`Refused::Busy`]). Small reviews (one object written, read or watched:
//! most of what the API server sends) have a room of their own, so that
//! large reviews, however slowly they arrive, never keep them out. A
//! reservation lasts until the answer is handed to the connection: the
//! bytes of a review are held while it is read, decoded, converted and
//! answered, and the answer is about its size.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The largest review that counts as small: one object of the largest the
/// API server stores (etcd refuses more than 1.5 MiB; most are a few KiB)
/// does not always fit, a review of a few hundred ordinary ones does.
const SMALL: u32 = 1 << 20;
/// The bytes of small reviews held at once: eight of the largest, or
/// hundreds of ordinary ones.
const SMALL_ROOM: u32 = 8 << 20;
/// The bytes of large reviews held at once, and the largest review read.
/// Answering a review takes about 22 times its size while it is decoded
/// and converted (measured: 8 MiB of ordinary objects, 15,000 Greetings,
/// peaked 175 MiB above the resident memory before it; 1 MiB, 26 MiB),
/// and two are answered at once ([`super::worker`]): this room and the
/// largest small review keep that peak near 200 MiB, within the
/// Deployment's 512 MiB with the operator's own. The API server sends
/// every object of a list that needs converting in one review: a list at
/// a version other than the stored one fails when its objects take more
/// than this (a paginated list, kubectl's chunks of 500, takes less).
const LARGE_ROOM: u32 = 8 << 20;

/// The sizes of the two rooms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rooms {
    /// The largest review that counts as small.
    pub small_max: u32,
    /// The bytes of small reviews held at once.
    pub small: u32,
    /// The bytes of large reviews held at once, and the largest review.
    pub large: u32,
}

impl Default for Rooms {
    fn default() -> Self {
        Self {
            small_max: SMALL,
            small: SMALL_ROOM,
            large: LARGE_ROOM,
        }
    }
}

/// One of the two rooms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Reviews up to [`Rooms::small_max`].
    Small,
    /// Larger reviews.
    Large,
}

impl std::fmt::Display for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Small => "small",
            Self::Large => "large",
        })
    }
}

/// Why a review was refused before its body was read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No `Content-Length` (a chunked body): its size is unknown until read.
    #[error("a review must announce its length (Content-Length)")]
    NoLength,
    /// More than the largest review read.
    #[error("a review is at most {max} bytes, this one announces {announced}")]
    TooLarge {
        /// What it announced.
        announced: u64,
        /// The largest review read.
        max: u32,
    },
    /// Its room holds as many bytes as it may now; the API server retries
    /// (a 503 with `Retry-After`), by then a reservation has ended.
    #[error("the webhook holds as many {room} reviews as it reads at once; retry")]
    Busy {
        /// The room that is full.
        room: Room,
    },
}

/// The bytes of one review, held until dropped.
#[derive(Debug)]
pub struct Reservation {
    bytes: u32,
    _permit: OwnedSemaphorePermit,
}

impl Reservation {
    /// The bytes reserved: the length the review announced.
    pub fn bytes(&self) -> u32 {
        self.bytes
    }
}

/// The two rooms, shared by every connection.
#[derive(Debug, Clone)]
pub struct Budget {
    rooms: Rooms,
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
}

impl Budget {
    /// Empty rooms of `rooms`' sizes.
    pub fn new(rooms: Rooms) -> Self {
        Self {
            rooms,
            small: Arc::new(Semaphore::new(rooms.small as usize)),
            large: Arc::new(Semaphore::new(rooms.large as usize)),
        }
    }

    /// Reserves the `announced` bytes of a review in its room, at once or
    /// not at all.
    pub fn reserve(&self, announced: Option<u64>) -> Result<Reservation, Refused> {
        let announced = announced.ok_or(Refused::NoLength)?;
        let max = self.rooms.large;
        let bytes = u32::try_from(announced)
            .ok()
            .filter(|bytes| *bytes <= max)
            .ok_or(Refused::TooLarge { announced, max })?;
        let (room, semaphore) = if bytes <= self.rooms.small_max {
            (Room::Small, &self.small)
        } else {
            (Room::Large, &self.large)
        };
        let permit = (semaphore.clone().try_acquire_many_owned(bytes))
            .map_err(|_| Refused::Busy { room })?;
        Ok(Reservation {
            bytes,
            _permit: permit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> Budget {
        Budget::new(Rooms {
            small_max: 10,
            small: 30,
            large: 100,
        })
    }

    #[test]
    fn a_review_without_a_length_or_longer_than_the_largest_is_refused() {
        let budget = budget();
        assert_eq!(budget.reserve(None).unwrap_err(), Refused::NoLength);
        let refused = budget.reserve(Some(101)).unwrap_err();
        assert_eq!(
            refused,
            Refused::TooLarge {
                announced: 101,
                max: 100
            }
        );
        let refused = budget.reserve(Some(u64::MAX)).unwrap_err();
        assert!(matches!(refused, Refused::TooLarge { .. }), "{refused}");
        assert_eq!(budget.reserve(Some(100)).unwrap().bytes(), 100);
    }

    #[test]
    fn large_reviews_fill_their_room_and_leave_the_small_ones_theirs() {
        let budget = budget();
        let first = budget.reserve(Some(60)).unwrap();
        let second = budget.reserve(Some(40)).unwrap();
        let refused = budget.reserve(Some(11)).unwrap_err();
        assert_eq!(refused, Refused::Busy { room: Room::Large });
        let _small: Vec<Reservation> = (0..3).map(|_| budget.reserve(Some(10)).unwrap()).collect();
        let refused = budget.reserve(Some(1)).unwrap_err();
        assert_eq!(refused, Refused::Busy { room: Room::Small });
        drop(first);
        assert_eq!(budget.reserve(Some(60)).unwrap().bytes(), 60, "freed");
        drop(second);
    }
}
