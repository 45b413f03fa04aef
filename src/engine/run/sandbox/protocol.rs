//! What the operator and a render worker say to each other over the
//! worker's standard input and output: frames of a 4-byte little-endian
//! length and that many bytes of JSON.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::engine::model::templates::TemplateSources;

/// The longest frame either side accepts, in bytes: a resource's context
/// is at most what the API server stores (about 1.5 MiB), a set of
/// templates at most a definition's 512 KiB.
pub const FRAME_LIMIT: usize = 16 << 20;

/// What the operator asks.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Parse and keep a template set under its digest.
    Load(TemplateSources),
    /// Render template `name` of the set `id` for `context`.
    Render {
        /// The set's digest.
        id: u64,
        /// The template.
        name: String,
        /// What the template sees.
        context: serde_json::Value,
    },
}

/// What the worker answers.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Response {
    /// The set is loaded.
    Loaded,
    /// What the template wrote.
    Rendered(String),
    /// Why the set did not load or the template did not render.
    Failed(String),
    /// The set is not (or no longer) loaded: load it and ask again.
    UnknownSet,
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The pipe failed or closed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The frame is larger than [`FRAME_LIMIT`].
    #[error("a frame of {0} bytes is larger than the limit")]
    TooLarge(usize),
    /// The frame is not the JSON expected.
    #[error("a frame does not decode: {0}")]
    Json(#[from] serde_json::Error),
}

/// Writes `message` as one frame.
pub fn write_frame(out: &mut impl Write, message: &impl Serialize) -> Result<(), FrameError> {
    let bytes = serde_json::to_vec(message)?;
    if bytes.len() > FRAME_LIMIT {
        return Err(FrameError::TooLarge(bytes.len()));
    }
    let length = u32::try_from(bytes.len()).map_err(|_| FrameError::TooLarge(bytes.len()))?;
    out.write_all(&length.to_le_bytes())?;
    out.write_all(&bytes)?;
    out.flush()?;
    Ok(())
}

/// Reads one frame; `Ok(None)` at the end of the input.
pub fn read_frame<T: for<'de> Deserialize<'de>>(
    input: &mut impl Read,
) -> Result<Option<T>, FrameError> {
    let mut length = [0u8; 4];
    match input.read_exact(&mut length) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let length = u32::from_le_bytes(length) as usize;
    if length > FRAME_LIMIT {
        return Err(FrameError::TooLarge(length));
    }
    let mut bytes = vec![0u8; length];
    input.read_exact(&mut bytes)?;
    Ok(Some(serde_json::from_slice(&bytes)?))
}
