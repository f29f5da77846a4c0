//! How a scenario ended, when it did not fail.

/// How a scenario ended, when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScenarioOutcome {
    Passed,
    /// The cluster lacks what the scenario needs (said why).
    Skipped(String),
}
