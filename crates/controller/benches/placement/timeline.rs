//! Per-claim timelines: when the controller saw each benchmark claim and pod, took the pod off its
//! queue, decided, wrote the allocation and released the pod — read from the controller's
//! `tessera_controller::timing` debug events (JSON log lines, Unix microseconds) — beside the
//! benchmark's own instants (claim created, allocation seen on its watch). A build of the
//! controller without those events gives timelines with the benchmark's instants only.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The log filter the controller runs with in the benchmark: its usual `info`, and the timing
/// events.
pub const LOG_FILTER: &str = "info,tessera_controller::timing=debug";

/// Maps the benchmark's [`Instant`]s to Unix time (the controller logs Unix time).
pub struct Clock {
    instant: Instant,
    unix_micros: f64,
}

impl Clock {
    pub fn now() -> Clock {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("the clock is after 1970");
        Clock {
            instant: Instant::now(),
            unix_micros: unix.as_secs_f64() * 1e6,
        }
    }

    /// `at` in Unix microseconds.
    pub fn unix_micros(&self, at: Instant) -> f64 {
        match at.checked_duration_since(self.instant) {
            Some(after) => self.unix_micros + after.as_secs_f64() * 1e6,
            None => self.unix_micros - self.instant.duration_since(at).as_secs_f64() * 1e6,
        }
    }
}

/// The controller's timing steps per pod name (namespace left out), in log order: `(step, Unix
/// µs)`. A claim's `claim-seen` step is filed under the pod of the same name less `-gpus`.
pub fn controller_steps(log: &Path) -> HashMap<String, Vec<(String, f64)>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut steps: HashMap<String, Vec<(String, f64)>> = HashMap::new();
    for line in text
        .lines()
        .filter(|l| l.contains("tessera_controller::timing"))
    {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let fields = &event["fields"];
        let (Some(key), Some(step), Some(at)) = (
            fields["pod"].as_str(),
            fields["step"].as_str(),
            fields["unix_us"].as_f64(),
        ) else {
            continue;
        };
        let name = key.rsplit('/').next().unwrap_or(key);
        let pod = name.strip_suffix("-gpus").unwrap_or(name);
        let step = match fields["outcome"].as_str() {
            Some(outcome) => format!("{step} ({outcome})"),
            None => step.to_owned(),
        };
        steps.entry(pod.to_owned()).or_default().push((step, at));
    }
    steps
}

/// One claim's way through the controller.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimTimeline {
    pub claim: String,
    pub phase: &'static str,
    pub gpus: i64,
    /// Created, in milliseconds after the phase's first claim was created.
    pub created_millis: f64,
    /// Created → allocation seen on the benchmark's watch.
    pub latency_millis: f64,
    /// The controller's steps for the claim and its pod, in milliseconds after the claim was
    /// created: `claim-seen`, `queued`, `popped`, `decided`, `allocated`, `released`, `done
    /// (<outcome>)`; a pod processed more than once has its steps more than once.
    pub steps: Vec<(String, f64)>,
}

impl ClaimTimeline {
    /// The steps as `step +ms` text.
    pub fn describe(&self) -> String {
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|(step, at)| format!("{step} {at:+.1}"))
            .collect();
        format!(
            "{} ({} GPUs, created at {:.0} ms): allocation seen after {:.1} ms; controller: {}",
            self.claim,
            self.gpus,
            self.created_millis,
            self.latency_millis,
            if steps.is_empty() {
                "no timing events".to_owned()
            } else {
                steps.join(", ")
            }
        )
    }
}

/// The timeline of a claim created at `created` (Unix µs) whose allocation was seen at `seen`.
pub fn timeline(
    claim: &str,
    phase: &'static str,
    gpus: i64,
    (phase_start, created, seen): (f64, f64, f64),
    steps: &HashMap<String, Vec<(String, f64)>>,
) -> ClaimTimeline {
    let pod = claim.strip_suffix("-gpus").unwrap_or(claim);
    ClaimTimeline {
        claim: claim.to_owned(),
        phase,
        gpus,
        created_millis: (created - phase_start) / 1e3,
        latency_millis: (seen - created) / 1e3,
        steps: steps
            .get(pod)
            .into_iter()
            .flatten()
            .map(|(step, at)| (step.clone(), (at - created) / 1e3))
            .collect(),
    }
}
