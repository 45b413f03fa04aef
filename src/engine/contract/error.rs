//! Why a handler could not produce a plan.

use crate::engine::model::status::Reason;

/// Why a handler could not produce a plan.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HandlerError {
    /// The resource's spec cannot be acted on; retrying will not help until
    /// it changes. Reported as `Ready=False`, reason `InvalidSpec`.
    #[error("{0}")]
    Invalid(String),
    /// The resource asks for more than a configured limit allows; reported
    /// as `TooLarge` and, like an invalid spec, waits for a change.
    #[error("{0}")]
    TooLarge(String),
    /// Something outside the resource failed (an API read, an HTTP fetch);
    /// retried with backoff.
    #[error("{message}")]
    Transient {
        /// The condition reason.
        reason: Reason,
        /// What went wrong.
        message: String,
    },
}

impl HandlerError {
    /// A transient error with the given reason.
    pub fn transient(reason: Reason, message: impl std::fmt::Display) -> Self {
        Self::Transient {
            reason,
            message: message.to_string(),
        }
    }

    /// The condition reason for this error.
    pub fn reason(&self) -> Reason {
        match self {
            Self::Invalid(_) => Reason::InvalidSpec,
            Self::TooLarge(_) => Reason::TooLarge,
            Self::Transient { reason, .. } => *reason,
        }
    }

    /// True when retrying cannot help until the resource changes.
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::Invalid(_) | Self::TooLarge(_))
    }
}

impl From<kube::Error> for HandlerError {
    fn from(e: kube::Error) -> Self {
        Self::transient(Reason::ApiError, crate::error_text::kube(&e))
    }
}
