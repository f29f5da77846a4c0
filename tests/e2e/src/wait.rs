//! Polling with a deadline. A probe says either "done" (with a value) or what it sees now; a
//! timeout error then reads "waited N s for WHAT; last seen: …", which is what a person needs
//! to tell a slow cluster from a wrong result. A probe error is a hard failure (a wrong result
//! that waiting cannot fix).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use anyhow::bail;

/// What a probe saw.
pub enum Progress<T> {
    Done(T),
    Waiting(String),
}

/// How often probes run.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Runs `probe` until it is done, fails, or `timeout` passes.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Progress<T>>>,
{
    let start = Instant::now();
    loop {
        let seen = match probe().await? {
            Progress::Done(value) => return Ok(value),
            Progress::Waiting(seen) => seen,
        };
        if start.elapsed() >= timeout {
            bail!(
                "waited {} s for {what}; last seen: {seen}",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Checks that `probe` keeps holding for `period` (e.g. "the pod stays ContainerCreating"):
/// fails as soon as it does not, with what it saw.
pub async fn holds_for<F, Fut>(what: &str, period: Duration, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Result<(), String>>>,
{
    let start = Instant::now();
    while start.elapsed() < period {
        if let Err(seen) = probe().await? {
            bail!(
                "expected {what} for {} s, but after {} s: {seen}",
                period.as_secs(),
                start.elapsed().as_secs()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn until_returns_the_value_once_done() {
        let calls = Cell::new(0);
        let value = until("three calls", Duration::from_secs(10), || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                Ok(if n == 3 {
                    Progress::Done(n)
                } else {
                    Progress::Waiting(format!("call {n}"))
                })
            }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn until_times_out_with_the_last_observation() {
        let error = until("a pod", Duration::from_secs(2), || async {
            Ok(Progress::<()>::Waiting("Pending".to_owned()))
        })
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(error, "waited 2 s for a pod; last seen: Pending");
    }

    #[tokio::test(start_paused = true)]
    async fn probe_errors_fail_at_once() {
        let error = until("x", Duration::from_secs(60), || async {
            Err::<Progress<()>, _>(anyhow::anyhow!("wrong devices"))
        })
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(error, "wrong devices");
    }

    #[tokio::test(start_paused = true)]
    async fn holds_for_reports_the_first_violation() {
        holds_for("quiet", Duration::from_secs(3), || async { Ok(Ok(())) })
            .await
            .unwrap();
        let calls = Cell::new(0);
        let error = holds_for("Pending", Duration::from_secs(30), || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                Ok(if n < 4 {
                    Ok(())
                } else {
                    Err("Running".to_owned())
                })
            }
        })
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(error, "expected Pending for 30 s, but after 1 s: Running");
    }
}
