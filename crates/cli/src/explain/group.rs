//! `tessera explain --pod` for a pod of a group (gang): the verdict on its group, from
//! `tessera_placement::ClusterObjects::decide` — the controller's own entry point and decision —
//! with each waiting pod's account (where it fits alone, or why not).

use std::io::Write;

use serde::Serialize;
use tessera_placement::group::{GroupOutcome, PodAccount};
use tessera_placement::{Action, GroupVerdict, PodReason};

use crate::output::OutputFormat;

/// What `-o json` prints for a pod of a group.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct GroupReport {
    pod: String,
    /// `PlaceGroup`, `WaitGroup` or `InvalidGroup`.
    action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_count: Option<u32>,
    placed_already: u32,
    /// The gated pods with their claims, in the order the decision tries them.
    members: Vec<String>,
    /// Where the group goes (`gpu.tessera.dev/rack=r1`, `fabricClique=…`, the whole cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
    /// Per pod: its node, and a note (placed; or where it fits alone / why not).
    pods: Vec<PodLine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<PodReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    steps: usize,
    truncated: bool,
}

#[derive(Debug, Serialize)]
struct PodLine {
    pod: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    note: String,
}

/// The report of a group that was not decided (its definition is wrong, its PodGroup is
/// missing, or an earlier group holds it back).
fn undecided(report: &mut GroupReport, verdict: GroupVerdict) {
    let (action, reason, message) = match verdict {
        GroupVerdict::Invalid(why) => ("InvalidGroup", PodReason::InvalidInput, why),
        GroupVerdict::MissingPodGroup { key, .. } => (
            "InvalidGroup",
            PodReason::InvalidInput,
            format!(
                "{key} is not among the objects; without it the group waits ({})",
                PodReason::WaitingForGroup
            ),
        ),
        GroupVerdict::HeldBack { key, message, .. } => {
            report.group = Some(key.to_string());
            ("WaitGroup", PodReason::WaitingBehindGroup, message)
        }
        GroupVerdict::Preempting { key, message, .. } => {
            report.group = Some(key.to_string());
            ("Preempting", PodReason::Preempting, message)
        }
        GroupVerdict::Decided { .. } => return,
    };
    report.action = action;
    report.reason = Some(reason);
    report.message = Some(message);
}

fn report(wanted: &str, verdict: GroupVerdict) -> GroupReport {
    let mut report = GroupReport {
        pod: wanted.to_owned(),
        ..GroupReport::default()
    };
    let GroupVerdict::Decided {
        key,
        min_count,
        placed,
        members,
        plan: decision,
    } = verdict
    else {
        undecided(&mut report, verdict);
        return report;
    };
    report.group = Some(key.to_string());
    report.min_count = Some(min_count);
    report.placed_already = placed;
    report.steps = decision.steps;
    report.truncated = decision.truncated;
    match decision.outcome {
        GroupOutcome::Place {
            plans,
            domain,
            score,
        } => {
            report.action = "PlaceGroup";
            report.domain = Some(domain.to_string());
            report.message = Some(format!("{score:?}"));
            for (index, d) in plans {
                let (node, note) = match &d.action {
                    Action::Place(p) => (Some(p.node.clone()), format!("placed ({})", p.score)),
                    Action::Release { node } => (node.clone(), "already allocated".to_owned()),
                    other => (None, format!("{other:?}")),
                };
                report.pods.push(PodLine {
                    pod: members[index].clone(),
                    node,
                    note,
                });
            }
        }
        GroupOutcome::Wait {
            reason,
            message,
            pods,
            ..
        } => {
            report.action = "WaitGroup";
            report.reason = Some(reason);
            report.message = Some(message);
            report.pods = pods
                .into_iter()
                .map(|PodAccount { pod, node, message }| PodLine {
                    pod,
                    node,
                    note: message,
                })
                .collect();
        }
    }
    report.members = members;
    report
}

/// Explains the verdict on the group of the pod `wanted`.
pub fn explain(
    verdict: GroupVerdict,
    wanted: &str,
    output: OutputFormat,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let r = report(wanted, verdict);
    match output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &r)?;
            writeln!(out)?;
        }
        OutputFormat::Text => write_text(out, &r)?,
    }
    Ok(())
}

fn write_text(out: &mut impl Write, r: &GroupReport) -> anyhow::Result<()> {
    let group = r.group.as_deref().unwrap_or("its group");
    let message = r.message.as_deref().unwrap_or_default();
    match r.action {
        "InvalidGroup" => {
            writeln!(out, "pod {}: its group cannot be decided: {message}", r.pod)?;
            return Ok(());
        }
        "PlaceGroup" => writeln!(
            out,
            "pod {} is in {group} (minCount {}, {} placed already): the controller places {} pods together in {}:",
            r.pod,
            r.min_count.unwrap_or_default(),
            r.placed_already,
            r.pods.len(),
            r.domain.as_deref().unwrap_or_default()
        )?,
        _ => writeln!(
            out,
            "pod {} is in {group} (minCount {}, {} placed already), which waits ({}): {message}",
            r.pod,
            r.min_count.unwrap_or_default(),
            r.placed_already,
            r.reason.map(PodReason::as_str).unwrap_or_default()
        )?,
    }
    for line in &r.pods {
        writeln!(
            out,
            "  {}: {}{}",
            line.pod,
            line.node
                .as_deref()
                .map(|n| format!("node {n}, "))
                .unwrap_or_default(),
            line.note.lines().next().unwrap_or_default()
        )?;
    }
    writeln!(
        out,
        "  {} pod decisions{}",
        r.steps,
        if r.truncated {
            "; the search stopped at its budget"
        } else {
            ""
        }
    )?;
    Ok(())
}
