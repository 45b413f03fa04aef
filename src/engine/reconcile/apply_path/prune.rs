//! Pruning: deleting the objects that left the resource's inventory, only
//! those carrying its marker.

use std::collections::BTreeSet;

use super::record::event;
use crate::engine::contract::EventType;
use crate::engine::contract::Handler;
use crate::engine::contract::PlannedEvent;
use crate::engine::model::inventory::Inventory;
use crate::engine::model::inventory::ObjectId;
use crate::engine::model::outcome::Failure;
use crate::engine::model::status::Reason;
use crate::engine::reconcile::context::Context;
use crate::engine::reconcile::steps;
use crate::engine::reconcile::steps::Actor;
use crate::engine::reconcile::steps::Done;

/// What a run may prune: what the resource owned (its recorded
/// `inventory`) and what its kind says it no longer wants (`stale`). Of
/// these, what the run does not produce again goes, each only if it still
/// carries the resource's marker.
pub(crate) fn prune_candidates(
    inventory: Option<&Inventory>,
    stale: &[ObjectId],
) -> BTreeSet<ObjectId> {
    let mut candidates = inventory.map(Inventory::ids).unwrap_or_default();
    candidates.extend(stale.iter().cloned());
    candidates
}

/// Deletes what left the inventory (only objects still carrying the marker).
pub(super) async fn prune<H: Handler>(
    ctx: &Context<H>,
    actor: &Actor<'_>,
    gone: BTreeSet<ObjectId>,
    before: &BTreeSet<ObjectId>,
    after: &BTreeSet<ObjectId>,
    done: &mut Done,
) -> Result<(), Failure> {
    if gone.is_empty() {
        return Ok(());
    }
    let gone: Vec<ObjectId> = gone.into_iter().collect();
    let report = steps::delete_owned(&ctx.engine, actor, gone, Reason::PruneFailed, done)
        .await
        .map_err(|mut f| {
            let kept: BTreeSet<ObjectId> = before.union(after).cloned().collect();
            f.inventory = Some(Inventory::of(&kept));
            f
        })?;
    let deleted: Vec<String> = report.deleted.iter().map(ToString::to_string).collect();
    if !deleted.is_empty() {
        done.events.push(event(
            EventType::Normal,
            "Pruned",
            "deleted what it no longer renders",
            &deleted,
        ));
    }
    if let Some(note) = steps::dropped_entries(&report) {
        done.events.push(PlannedEvent {
            type_: EventType::Warning,
            reason: "InventoryIgnored",
            note,
            related: None,
        });
    }
    Ok(())
}
