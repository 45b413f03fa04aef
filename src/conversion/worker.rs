//! Where reviews are answered: on a thread of their own, whose stack fits
//! any object the API server accepts.
//!
//! The API server stores objects nested up to 10,000 levels deep (it
//! refuses deeper JSON as it decodes it), and a tenant may write one into
//! any field that keeps unknown fields, or into its managedFields. The API
//! server sends every object of a list that needs converting in one review,
//! so a review the webhook cannot read fails the whole list at that version,
//! for every tenant (the operator's own watch among them). serde_json stops
//! at 128 levels by default, and decoding, converting, encoding and
//! dropping a value all recurse; so a pass without recursion
//! ([`crate::guard::scan::depth`]) first checks the review is within
//! [`MAX_DEPTH`], and the review is then answered on a thread whose stack
//! ([`STACK`]) fits that depth, a few at once.

use std::sync::Arc;

use tokio::sync::{Semaphore, oneshot};

use super::{Conversions, review};
use crate::guard::scan;

/// The deepest review read: the API server's own limit for an object
/// (10,000), and the three levels a review wraps each object in.
pub const MAX_DEPTH: usize = 10_010;
/// The stack of a thread that answers a review: about 13 KiB for each
/// level of [`MAX_DEPTH`], five times or more what an unoptimised build
/// needs (16 to 24 MiB at that depth, objects and lists in turn: see the
/// tests). Reserved, not used: a thread touches what its review needs.
const STACK: usize = 128 << 20;
/// How many reviews are answered at once.
const AT_ONCE: usize = 2;

/// Why a request was not answered with a review.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// Deeper than any object the API server accepts.
    #[error("nested {0} levels deep, more than the {MAX_DEPTH} a review of stored objects can be")]
    TooDeep(usize),
    /// Not JSON.
    #[error("not JSON")]
    Malformed,
    /// JSON, but not a `ConversionReview` (where; never what was there).
    #[error("not a ConversionReview: {category:?} error at line {line}, column {column}")]
    NotAReview {
        /// What kind of error serde_json found.
        category: serde_json::error::Category,
        /// Where.
        line: usize,
        /// Where.
        column: usize,
    },
    /// The answer could not be encoded.
    #[error("cannot encode the answer: {0}")]
    Encode(serde_json::Error),
    /// No thread could be started, or it ended without an answer.
    #[error("no thread to answer on: {0}")]
    Thread(String),
}

/// Answers reviews from the kinds' conversions, at most [`AT_ONCE`] at once.
#[derive(Debug, Clone)]
pub struct Workers {
    conversions: Arc<Conversions>,
    slots: Arc<Semaphore>,
}

impl Workers {
    /// Workers answering from `conversions`.
    pub fn new(conversions: Arc<Conversions>) -> Self {
        Self {
            conversions,
            slots: Arc::new(Semaphore::new(AT_ONCE)),
        }
    }

    /// The encoded answer to the review `body`.
    pub async fn answer(&self, body: axum::body::Bytes) -> Result<Vec<u8>, Refused> {
        let _slot = (self.slots.acquire().await).map_err(|e| Refused::Thread(e.to_string()))?;
        let conversions = self.conversions.clone();
        let (done, answered) = oneshot::channel();
        std::thread::Builder::new()
            .name("conversion".into())
            .stack_size(STACK)
            .spawn(move || {
                let _ = done.send(answer(&body, &conversions));
            })
            .map_err(|e| Refused::Thread(e.to_string()))?;
        answered
            .await
            .map_err(|_| Refused::Thread("it ended without an answer".into()))?
    }
}

/// The encoded answer to the review `body`; to be run on a thread of
/// [`STACK`], where every value of it is also dropped.
fn answer(body: &[u8], conversions: &Conversions) -> Result<Vec<u8>, Refused> {
    let depth = scan::depth(body).map_err(|_| Refused::Malformed)?;
    if depth > MAX_DEPTH {
        return Err(Refused::TooDeep(depth));
    }
    let mut decoder = serde_json::Deserializer::from_slice(body);
    decoder.disable_recursion_limit();
    let review =
        serde::Deserialize::deserialize(&mut decoder).map_err(|e| Refused::NotAReview {
            category: e.classify(),
            line: e.line(),
            column: e.column(),
        })?;
    serde_json::to_vec(&review::answer(review, conversions)).map_err(Refused::Encode)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn workers() -> Workers {
        Workers::new(Arc::new(crate::conversion::review::tests::conversions()))
    }

    /// `levels` of objects and lists in turn around `1`, as text: a
    /// `Value` that deep could not be dropped on a test's stack.
    fn nested(levels: usize) -> String {
        let open: String = (0..levels)
            .map(|i| if i % 2 == 0 { r#"{"a":"# } else { "[" })
            .collect();
        let close: String = (0..levels)
            .rev()
            .map(|i| if i % 2 == 0 { "}" } else { "]" })
            .collect();
        format!("{open}1{close}")
    }

    /// A review of one Greeting at v1 whose `spec.extra` is `levels`
    /// deep, asking for v2.
    fn deep_review(levels: usize) -> String {
        format!(
            r#"{{"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview",
               "request":{{"uid":"u-1","desiredAPIVersion":"hello.example.com/v2",
               "objects":[{{"apiVersion":"hello.example.com/v1","kind":"Greeting",
               "metadata":{{"name":"deep"}},"spec":{{"message":"hi","extra":{}}}}}]}}}}"#,
            nested(levels)
        )
    }

    #[tokio::test]
    async fn an_object_as_deep_as_the_api_server_stores_is_converted_whole() {
        let levels = MAX_DEPTH - 5;
        let answer = workers()
            .answer(deep_review(levels).into())
            .await
            .expect("answered");
        let text = String::from_utf8(answer).unwrap();
        assert!(text.contains(r#""text":"hi""#), "the field moved");
        assert!(text.contains(r#""apiVersion":"hello.example.com/v2""#));
        assert!(text.contains(r#""status":"Success""#));
        assert!(text.contains(&nested(levels)), "the deep value kept whole");
    }

    #[tokio::test]
    async fn deeper_than_the_api_server_stores_or_not_a_review_is_refused_without_content() {
        let refused = workers().answer(deep_review(MAX_DEPTH).into()).await;
        assert!(matches!(refused, Err(Refused::TooDeep(_))), "{refused:?}");
        let refused = workers().answer(r#"{"a": "#.into()).await;
        assert!(matches!(refused, Err(Refused::Malformed)), "{refused:?}");
        let secret = json!({"request": {"uid": 7, "objects": "secret words"}}).to_string();
        let refused = workers().answer(secret.into()).await.unwrap_err();
        assert!(!refused.to_string().contains("secret"), "{refused}");
        assert!(matches!(refused, Refused::NotAReview { .. }), "{refused}");
    }
}
