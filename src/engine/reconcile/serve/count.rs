//! How many resources a kind has in every namespace and shard: the UIDs
//! of their metadata, listed, then followed by a watch of its own where
//! the kind's resource watch sees only part of them (an operator for one
//! namespace, a shard). Only a kind defined in the cluster is counted: a
//! definition's count shows in its status and guards its deletion.
//!
//! kube's watcher reads a watch's lines through a buffer of 8 KiB (fixed
//! in `Client::request_events`) that an idle watch keeps, with the
//! watcher's state beside it: for a definition served for one namespace,
//! a fifth of what it cost. This watch reads each line as it comes and,
//! while idle, holds only the UIDs and the response it reads from.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::{AsyncBufRead, AsyncBufReadExt as _};
use kube::Resource as _;
use kube::api::{DynamicObject, ListParams, WatchParams};
use kube::core::Request;
use kube::runtime::watcher::DefaultBackoff;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::Counted;

/// How long one watch request runs before the server ends it and it is
/// made again from where it was (kube's watcher asks the same).
const WATCH_TIMEOUT: u32 = 290;

/// How many resources a page of the list holds.
const PAGE: u32 = 500;

/// The longest wait between two tries after failures.
const LONGEST_WAIT: Duration = Duration::from_secs(30);

/// How many resources a kind has, once they were counted.
#[derive(Debug, Default)]
pub(crate) struct Count {
    value: AtomicU64,
    known: AtomicBool,
}

impl Count {
    fn set(&self, value: usize) {
        self.value.store(value as u64, Ordering::Relaxed);
        self.known.store(true, Ordering::Relaxed);
    }

    /// The count, once known.
    pub fn get(&self) -> Option<u64> {
        self.known
            .load(Ordering::Relaxed)
            .then(|| self.value.load(Ordering::Relaxed))
    }
}

/// A count, and what to call when it changes.
pub(super) struct Tally {
    /// The count.
    pub count: Arc<Count>,
    /// Called when it changes.
    pub on_count: super::OnCount,
}

impl Tally {
    /// The count is `value` now.
    pub(super) fn set(&self, value: usize) {
        if self.count.get() != Some(value as u64) {
            self.count.set(value);
            (self.on_count)();
        }
    }
}

/// Why counting stopped for a while.
#[derive(Debug, thiserror::Error)]
enum CountError {
    #[error("{}", crate::error_text::kube(.0))]
    Request(#[from] kube::Error),
    #[error("the watch broke off: {0}")]
    Read(#[from] std::io::Error),
    #[error("the watch sent a line that is not an event: {0}")]
    Line(#[from] serde_json::Error),
    #[error("the watch's resource version expired")]
    Expired,
    #[error("the watch failed: {0}")]
    Failed(String),
}

/// Keeps `count` of the resources of `counted`'s kind in every namespace
/// and shard, calling its `on_count` whenever it changes; until `stop` is
/// cancelled. A failure lists them again, after a wait that grows while
/// failures follow one another (at once when the watch's version expired).
pub(super) async fn count(
    client: kube::Client,
    counted: Counted,
    count: Arc<Count>,
    stop: CancellationToken,
) {
    let tally = Tally {
        count,
        on_count: counted.on_count,
    };
    let request = Request::new(DynamicObject::url_path(&counted.resource, None));
    let mut backoff = DefaultBackoff::default();
    loop {
        let stopped = tokio::select! {
            () = stop.cancelled() => return,
            stopped = follow(&client, &request, &tally) => stopped,
        };
        let wait = match stopped {
            CountError::Expired => Duration::ZERO,
            error => {
                tracing::debug!(kind = counted.resource.kind, %error, "cannot count the kind's resources; listing them again");
                backoff.next().unwrap_or(LONGEST_WAIT)
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Lists the resources at `request`'s path, then follows their changes by
/// one watch request after another, until one fails.
async fn follow(client: &kube::Client, request: &Request, tally: &Tally) -> CountError {
    let (mut uids, mut version) = match list(client, request).await {
        Ok(listed) => listed,
        Err(error) => return error,
    };
    tally.set(uids.len());
    loop {
        if let Err(error) = watch(client, request, &mut version, &mut uids, tally).await {
            return error;
        }
    }
}

/// The UIDs of every resource at `request`'s path, and the resource
/// version they were listed at.
async fn list(
    client: &kube::Client,
    request: &Request,
) -> Result<(HashSet<String>, String), CountError> {
    let mut uids = HashSet::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = request
            .list_metadata(&params)
            .map_err(kube::Error::BuildRequest)?;
        let page: kube::core::ObjectList<kube::core::PartialObjectMeta<DynamicObject>> =
            client.request(page).await?;
        uids.extend(page.items.into_iter().filter_map(|o| o.metadata.uid));
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok((uids, page.metadata.resource_version.unwrap_or_default())),
        }
    }
}

/// One watch request from `version`, keeping `uids`, `version` and the
/// tally current, until the server ends it (`Ok`) or it fails.
async fn watch(
    client: &kube::Client,
    request: &Request,
    version: &mut String,
    uids: &mut HashSet<String>,
    tally: &Tally,
) -> Result<(), CountError> {
    let params = WatchParams::default().timeout(WATCH_TIMEOUT);
    let watch = request
        .watch_metadata(&params, version)
        .map_err(kube::Error::BuildRequest)?;
    let mut lines = Box::pin(client.request_stream(watch).await?);
    while let Some(line) = next_line(&mut lines).await? {
        if seen(&line, version, uids)? {
            tally.set(uids.len());
        }
    }
    Ok(())
}

/// The next whole line of `lines`, or `None` once they end (a line cut
/// short ends them too: the next watch starts from before it).
async fn next_line(
    lines: &mut (impl AsyncBufRead + Unpin),
) -> Result<Option<Vec<u8>>, std::io::Error> {
    // A new buffer for every line: none is kept while the watch idles.
    let mut line = Vec::new();
    lines.read_until(b'\n', &mut line).await?;
    Ok(line.ends_with(b"\n").then_some(line))
}

/// A line of a watch of metadata: what happened, and to what.
#[derive(Deserialize)]
struct Line {
    #[serde(rename = "type")]
    event: Event,
    #[serde(default)]
    object: Seen,
}

/// What happened, as a watch says it.
#[derive(Deserialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
enum Event {
    Added,
    Modified,
    Deleted,
    Bookmark,
    Error,
}

/// What a line carries: an object's metadata, or a failure's status.
#[derive(Deserialize, Default)]
#[serde(default)]
struct Seen {
    metadata: SeenMetadata,
    code: Option<u16>,
    message: Option<String>,
}

/// The metadata the count needs.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SeenMetadata {
    uid: Option<String>,
    resource_version: Option<String>,
}

/// Takes in one line of the watch: true when `uids` changed.
fn seen(line: &[u8], version: &mut String, uids: &mut HashSet<String>) -> Result<bool, CountError> {
    let Line { event, object } = serde_json::from_slice(line)?;
    if event == Event::Error {
        return Err(match object.code {
            Some(410) => CountError::Expired,
            _ => CountError::Failed(object.message.unwrap_or_default()),
        });
    }
    if let Some(seen_at) = object.metadata.resource_version {
        *version = seen_at;
    }
    let Some(uid) = object.metadata.uid else {
        return Ok(false);
    };
    Ok(match event {
        Event::Added | Event::Modified => uids.insert(uid),
        Event::Deleted => uids.remove(&uid),
        Event::Bookmark | Event::Error => false,
    })
}

#[cfg(test)]
mod tests;
