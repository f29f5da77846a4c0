//! Events on pods, published by a task of their own rather than on the worker's path. An event is
//! best effort (the pod's condition, written on the worker's path, says the same), and publishing
//! one is an API call that the next pod in the queue would otherwise wait for. The queue between
//! the worker and the task is bounded ([`EVENT_QUEUE`]): when it is full an event is dropped and
//! counted (`tessera_controller_events_dropped_total`), so a slow API server never makes the
//! worker wait or the controller's memory grow.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use prometheus_client::metrics::counter::Counter;
use tessera_placement::reason::EventKind;
use tokio::sync::mpsc;

use crate::api::ApiWriter;

/// Events waiting to be published, at most.
pub const EVENT_QUEUE: usize = 1024;

/// One event to publish about a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodEvent {
    pub pod: ObjectReference,
    pub kind: EventKind,
    pub reason: String,
    pub note: String,
}

impl PodEvent {
    pub fn new(pod: &Pod, kind: EventKind, reason: &str, note: &str) -> PodEvent {
        PodEvent {
            pod: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                namespace: pod.metadata.namespace.clone(),
                uid: pod.metadata.uid.clone(),
                ..Default::default()
            },
            kind,
            reason: reason.to_owned(),
            note: note.to_owned(),
        }
    }
}

/// The worker's end of the queue.
#[derive(Clone, Debug)]
pub struct Events {
    queue: mpsc::Sender<PodEvent>,
    dropped: Counter,
}

impl Events {
    /// A queue of `capacity` events whose drops count in `dropped`, and its receiving end.
    pub fn new(capacity: usize, dropped: Counter) -> (Events, mpsc::Receiver<PodEvent>) {
        let (queue, receiver) = mpsc::channel(capacity.max(1));
        (Events { queue, dropped }, receiver)
    }

    /// Queues `event` without waiting; drops it (and counts the drop) when the queue is full or
    /// its task has stopped.
    pub fn publish(&self, event: PodEvent) {
        if let Err(e) = self.queue.try_send(event) {
            self.dropped.inc();
            let event = match e {
                mpsc::error::TrySendError::Full(event)
                | mpsc::error::TrySendError::Closed(event) => event,
            };
            tracing::debug!(pod = ?event.pod.name, reason = %event.reason,
                "the event queue is full; event dropped");
        }
    }
}

/// Publishes the queued events one after the other until every [`Events`] is dropped and the
/// queue is empty.
pub async fn publish_all(mut queue: mpsc::Receiver<PodEvent>, writer: ApiWriter) {
    while let Some(event) = queue.recv().await {
        writer
            .event(&event.pod, event.kind, &event.reason, &event.note)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ml".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let dropped = Counter::default();
        let (events, mut queue) = Events::new(2, dropped.clone());
        for name in ["a", "b", "c"] {
            events.publish(PodEvent::new(
                &pod(name),
                EventKind::Normal,
                "Allocated",
                "placed",
            ));
        }
        assert_eq!(dropped.get(), 1, "the third event found the queue full");
        let first = queue.try_recv().expect("queued");
        assert_eq!(first.pod.name.as_deref(), Some("a"));
        assert_eq!(first.pod.uid.as_deref(), Some("uid-a"));
        assert_eq!(
            queue.try_recv().expect("queued").pod.name.as_deref(),
            Some("b")
        );
        assert!(queue.try_recv().is_err(), "the dropped one is not queued");
        // Room again: the next one is queued.
        events.publish(PodEvent::new(
            &pod("d"),
            EventKind::Warning,
            "Unsatisfiable",
            "no node",
        ));
        let next = queue.try_recv().expect("queued");
        assert_eq!(
            (next.pod.name.as_deref(), next.kind),
            (Some("d"), EventKind::Warning)
        );
        // The task stopped: events are dropped and counted, never an error for the worker.
        drop(queue);
        events.publish(PodEvent::new(
            &pod("e"),
            EventKind::Normal,
            "Allocated",
            "placed",
        ));
        assert_eq!(dropped.get(), 2);
    }
}
