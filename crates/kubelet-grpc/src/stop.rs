//! Stopping the servers and health streams of a plugin: one trigger, any number of signals.

use tokio::sync::watch;

/// Tells servers and health streams to stop.
pub(crate) struct StopTrigger(watch::Sender<bool>);

impl StopTrigger {
    pub(crate) fn stop(&self) {
        self.0.send_replace(true);
    }
}

/// Completes once the paired [`StopTrigger`] fires (or is dropped).
#[derive(Clone, Debug)]
pub(crate) struct StopSignal(watch::Receiver<bool>);

impl StopSignal {
    pub(crate) async fn stopped(mut self) {
        // An error means the trigger is gone, which also means: stop.
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }
}

pub(crate) fn stop_signal() -> (StopTrigger, StopSignal) {
    let (sender, receiver) = watch::channel(false);
    (StopTrigger(sender), StopSignal(receiver))
}
