//! The text the controller puts on a pod it cannot place: the same per-node account `tessera
//! explain` prints (the allocator's [`Unsatisfiable`] display), for the first few nodes, plus a
//! count of the nodes the pod's own constraints excluded — the scheduler's "0/N nodes are
//! available" in the allocator's words.

use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use tessera_allocator::{
    AllocateOptions, AllocatedState, DeviceIndex, Outcome, PlacementMode, Unsatisfiable, claim_name,
};

use crate::nodes::NodeFilter;

/// Nodes explained device by device in a pod's message; the rest are counted.
pub const EXPLAINED_NODES: usize = 3;

/// Longest pod condition message the controller writes (bytes).
pub const CONDITION_MESSAGE_LIMIT: usize = 4096;

/// Longest event note the API accepts (events.k8s.io/v1 `note`: 1 KiB).
pub const EVENT_NOTE_LIMIT: usize = 1024;

/// `ns/a, ns/b`.
pub fn claim_list(claims: &[Arc<ResourceClaim>]) -> String {
    claims
        .iter()
        .map(|c| claim_name(c))
        .collect::<Vec<_>>()
        .join(", ")
}

fn mode_name(options: &AllocateOptions) -> &'static str {
    match options.mode {
        PlacementMode::FirstFit => "first-fit",
        PlacementMode::TopologyAware => "topology-aware",
    }
}

/// Why `claims` fit on no node, given the search's brief account `searched` over the eligible
/// nodes of `nodes`. The first [`EXPLAINED_NODES`] nodes are diagnosed device by device again.
pub fn unsatisfiable_message(
    inventory: &DeviceIndex,
    claims: &[ResourceClaim],
    in_use: &AllocatedState,
    nodes: &NodeFilter,
    searched: &Unsatisfiable,
    options: &AllocateOptions,
) -> String {
    let names: Vec<String> = claims.iter().map(claim_name).collect();
    let noun = if names.len() == 1 { "claim" } else { "claims" };
    let mut text = format!(
        "{noun} {} cannot be allocated ({}): 0 of {} nodes fit",
        names.join(", "),
        mode_name(options),
        nodes.total
    );
    let eligible = searched.nodes.len();
    let mut reasons = Vec::new();
    if eligible > 0 {
        reasons.push(format!(
            "{eligible} without enough free devices for the claims"
        ));
    }
    let filtered = nodes.summary();
    if !filtered.is_empty() {
        reasons.push(filtered);
    }
    if !reasons.is_empty() {
        text.push_str(": ");
        text.push_str(&reasons.join(", "));
    }
    text.push('\n');
    let explain = AllocateOptions {
        explain: true,
        ..*options
    };
    for brief in searched.nodes.iter().take(EXPLAINED_NODES) {
        let detailed = match inventory.allocate(claims, in_use, Some(&brief.node), &explain) {
            Ok(Outcome::Unsatisfiable(u)) => u.to_string(),
            // The diagnosis could not be repeated (it should always be): keep the brief account.
            _ => brief.to_string(),
        };
        text.push_str(&detailed);
    }
    if eligible > EXPLAINED_NODES {
        text.push_str(&format!(
            "… and {} more nodes without enough free devices\n",
            eligible - EXPLAINED_NODES
        ));
    }
    text.trim_end().to_owned()
}

/// `text` cut to at most `limit` bytes on a character boundary, marked when cut.
pub fn truncate(text: &str, limit: usize) -> String {
    const MARK: &str = " … (truncated)";
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut end = limit.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

/// `note` joined to the first line of `message` (`summary; note`, then the rest): the account
/// of each node that follows can be long, and a reader cut short — an event's note holds
/// [`EVENT_NOTE_LIMIT`] bytes — must still see the note (why preemption cannot help: the
/// budget that protects the pods it would evict).
pub fn add_to_summary(message: &mut String, note: &str) {
    let at = message.find('\n').unwrap_or(message.len());
    message.insert_str(at, &format!("; {note}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_joins_the_summary_line_before_the_account_of_each_node() {
        let mut one_line = "claim ns/a cannot be allocated".to_owned();
        add_to_summary(&mut one_line, "why");
        assert_eq!(one_line, "claim ns/a cannot be allocated; why");
        let mut long = format!("summary\nnode n-0: {}", "x".repeat(2000));
        add_to_summary(&mut long, "protected by PodDisruptionBudget ns/b");
        assert!(
            truncate(&long, EVENT_NOTE_LIMIT)
                .starts_with("summary; protected by PodDisruptionBudget ns/b\nnode n-0: "),
            "{long}"
        );
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("short", 10), "short");
        let long = "é".repeat(100);
        let cut = truncate(&long, 40);
        assert!(cut.len() <= 40, "{}", cut.len());
        assert!(cut.ends_with("(truncated)"));
    }
}
