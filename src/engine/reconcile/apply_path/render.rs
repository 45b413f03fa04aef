//! Rendering a plan's overlays, with the ownership marker, and their digest.

use sha2::Digest;
use sha2::Sha256;

use crate::engine::contract::Plan;
use crate::engine::contract::Step;
use crate::engine::model::overlay::Marking;
use crate::engine::model::overlay::RenderedOverlay;

/// The plan's steps, rendered in memory, and a digest over all of them.
pub(crate) struct Rendered {
    /// Each step's overlay (`None` for steps without one).
    pub overlays: Vec<Option<RenderedOverlay>>,
    /// sha256 over every step.
    pub digest: String,
}

/// Renders every overlay of `plan`; owned ones get `marking`.
pub(crate) fn render<S>(
    plan: &Plan<S>,
    templates: &crate::engine::model::templates::KustomizeDir,
    marking: &Marking,
) -> Result<Rendered, crate::engine::model::overlay::OverlayError> {
    let mut hasher = Sha256::new();
    let mut overlays = Vec::with_capacity(plan.steps.len());
    for step in &plan.steps {
        let (tag, overlay) = match step {
            Step::Apply {
                overlay,
                field_manager,
            } => {
                hasher.update(format!("apply {field_manager:?}\n"));
                ("apply", Some(overlay.render(templates, Some(marking))?))
            }
            Step::Patch {
                overlay,
                field_manager,
            } => {
                hasher.update(format!("patch {field_manager}\n"));
                ("patch", Some(overlay.render(templates, None)?))
            }
            Step::DeleteForeign { objects } => {
                for o in objects {
                    hasher.update(format!("delete {o}/{}\n", o.api_version));
                }
                ("delete", None)
            }
        };
        hasher.update(tag.as_bytes());
        if let Some(o) = &overlay {
            hasher.update(o.digest().as_bytes());
        }
        overlays.push(overlay);
    }
    Ok(Rendered {
        overlays,
        digest: format!("sha256:{}", hex::encode(hasher.finalize())),
    })
}
