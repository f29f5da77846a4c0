//! Liveness of a process's background loops: each loop beats a [`Heartbeat`] every iteration,
//! and `/healthz` fails when one has been silent for longer than it promised.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One loop's heartbeat. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    name: &'static str,
    start: Instant,
    /// Milliseconds since `start` at the last beat.
    last: Arc<AtomicU64>,
    max_silence: Duration,
}

impl Heartbeat {
    /// A heartbeat for the loop `name`, which promises to beat at least every `max_silence`.
    /// Counts as beaten now.
    pub fn new(name: &'static str, max_silence: Duration) -> Self {
        Self {
            name,
            start: Instant::now(),
            last: Arc::new(AtomicU64::new(0)),
            max_silence,
        }
    }

    /// The loop is alive.
    pub fn beat(&self) {
        let elapsed = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(elapsed, Ordering::Relaxed);
    }

    /// The loop's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// How long since the last beat.
    pub fn silence(&self) -> Duration {
        let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }

    /// Whether the loop beat within its promise.
    pub fn is_alive(&self) -> bool {
        self.silence() <= self.max_silence
    }
}

/// The heartbeats `/healthz` checks.
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    heartbeats: Vec<Heartbeat>,
}

impl Liveness {
    /// Adds a loop to watch.
    pub fn watch(&mut self, heartbeat: Heartbeat) {
        self.heartbeats.push(heartbeat);
    }

    /// `Ok` when every loop is alive, else one line per stuck loop.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let stuck: Vec<String> = self
            .heartbeats
            .iter()
            .filter(|h| !h.is_alive())
            .map(|h| {
                format!(
                    "{} has not made progress for {:.1}s (limit {:.1}s)",
                    h.name,
                    h.silence().as_secs_f64(),
                    h.max_silence.as_secs_f64()
                )
            })
            .collect();
        if stuck.is_empty() { Ok(()) } else { Err(stuck) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_loop_is_reported() {
        let lively = Heartbeat::new("publisher", Duration::from_secs(60));
        let silent = Heartbeat::new("health monitor", Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        lively.beat();
        let mut liveness = Liveness::default();
        liveness.watch(lively.clone());
        assert!(liveness.check().is_ok());
        liveness.watch(silent);
        let stuck = liveness.check().unwrap_err();
        assert_eq!(stuck.len(), 1);
        assert!(
            stuck[0].starts_with("health monitor has not made progress"),
            "{stuck:?}"
        );
    }
}
