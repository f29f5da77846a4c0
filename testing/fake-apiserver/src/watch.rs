//! WATCH: a stream of newline-delimited JSON events, as the API server's watch cache sends them.
//!
//! - No `resourceVersion` (or `"0"`): a synthetic `ADDED` for every matching object, then changes.
//! - `resourceVersion=N`: the changes after N from the history; if N is older than the history,
//!   one `ERROR` event with code 410 (`Expired`) and the end of the stream — the answer that makes
//!   kube's watcher relist.
//! - `sendInitialEvents=true` (streaming lists, kube's `InitialListStrategy::StreamingList`): the
//!   synthetic `ADDED` events, then a `BOOKMARK` annotated `k8s.io/initial-events-end: "true"`.
//! - `allowWatchBookmarks=true`: a `BOOKMARK` with the newest resourceVersion every bookmark
//!   interval.
//! - Selectors apply to both sides of a change: an object that starts matching arrives as
//!   `ADDED`, one that stops matching as `DELETED`.
//! - The stream ends after `timeoutSeconds`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::shared::Inner;
use crate::store::{EventType, StoredEvent};

/// How long a watch without `timeoutSeconds` lasts.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// What a watch asked for.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub resource: &'static ResourceType,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// `None` for unset or `"0"`.
    pub resource_version: Option<u64>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
}

impl WatchRequest {
    fn matches(&self, resource: &ResourceType, object: &Value) -> bool {
        let in_namespace = self.namespace.as_deref().is_none_or(|ns| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        });
        resource.group == self.resource.group
            && resource.plural == self.resource.plural
            && in_namespace
            && self.labels.matches(object)
            && self.fields.matches(object)
    }

    /// What this watcher sees of a stored event, if anything.
    fn view(&self, event: &StoredEvent) -> Option<(&'static str, Arc<Value>)> {
        let now = self.matches(event.resource, &event.new);
        let before = event
            .old
            .as_ref()
            .is_some_and(|old| self.matches(event.resource, old));
        let kind = match (event.event_type, before, now) {
            (EventType::Added, _, true) => "ADDED",
            (EventType::Deleted, true, _) => "DELETED",
            (EventType::Modified, true, true) => "MODIFIED",
            (EventType::Modified, false, true) => "ADDED",
            (EventType::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some((kind, Arc::clone(&event.new)))
    }

    fn bookmark(&self, resource_version: u64, initial_end: bool) -> Value {
        let mut metadata = json!({"resourceVersion": resource_version.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({
            "type": "BOOKMARK",
            "object": {
                "kind": self.resource.kind,
                "apiVersion": self.resource.api_version(),
                "metadata": metadata,
            }
        })
    }
}

fn line(event: &Value) -> Result<Bytes, Infallible> {
    let mut text = serde_json::to_vec(event).expect("JSON values serialize");
    text.push(b'\n');
    Ok(Bytes::from(text))
}

fn event_line(kind: &str, object: &Value) -> Result<Bytes, Infallible> {
    #[derive(serde::Serialize)]
    struct WatchEventLine<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        object: &'a Value,
    }
    let mut text =
        serde_json::to_vec(&WatchEventLine { kind, object }).expect("JSON values serialize");
    text.push(b'\n');
    Ok(Bytes::from(text))
}

/// Starts a watch: returns the stream of event lines, fed by a task that ends with the stream.
pub fn start(
    inner: Arc<Inner>,
    request: WatchRequest,
) -> ReceiverStream<Result<Bytes, Infallible>> {
    let (sender, receiver) = mpsc::channel(256);
    let mut changes = inner.changes.subscribe();
    let (initial, cursor) = {
        let store = inner.store.lock().expect("store lock");
        let current = store.resource_version();
        match request.resource_version {
            Some(rv) if !request.send_initial_events => (Vec::new(), Some(rv)),
            _ => {
                let mut lines: Vec<_> = store
                    .list(request.resource, request.namespace.as_deref())
                    .filter(|(_, object)| request.matches(request.resource, object))
                    .map(|(_, object)| event_line("ADDED", object))
                    .collect();
                if request.send_initial_events {
                    lines.push(line(&request.bookmark(current, true)));
                }
                (lines, Some(current))
            }
        }
    };
    let bookmark_interval = *inner.bookmark_interval.lock().expect("bookmark lock");
    tokio::spawn(async move {
        for item in initial {
            if sender.send(item).await.is_err() {
                return;
            }
        }
        let mut cursor = cursor.unwrap_or_default();
        let deadline = tokio::time::sleep(request.timeout.unwrap_or(DEFAULT_WATCH_TIMEOUT));
        tokio::pin!(deadline);
        let mut bookmarks = tokio::time::interval(bookmark_interval);
        bookmarks.tick().await;
        loop {
            let (lines, next) = match pending(&inner, &request, cursor) {
                Ok(found) => found,
                Err(expired) => {
                    let _ = sender
                        .send(line(
                            &json!({"type": "ERROR", "object": expired.to_status()}),
                        ))
                        .await;
                    return;
                }
            };
            cursor = next;
            for item in lines {
                if sender.send(item).await.is_err() {
                    return;
                }
            }
            tokio::select! {
                () = &mut deadline => return,
                () = sender.closed() => return,
                changed = changes.changed() => if changed.is_err() { return },
                _ = bookmarks.tick(), if request.bookmarks => {
                    if sender.send(line(&request.bookmark(cursor, false))).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    ReceiverStream::new(receiver)
}

/// The lines for the events after `cursor`, and the new cursor; 410 when the history no longer
/// reaches back to `cursor`.
fn pending(
    inner: &Inner,
    request: &WatchRequest,
    cursor: u64,
) -> Result<(Vec<Result<Bytes, Infallible>>, u64), ApiError> {
    let store = inner.store.lock().expect("store lock");
    let events = store
        .events_after(cursor)
        .ok_or_else(|| ApiError::expired(cursor))?;
    let next = store.resource_version().max(cursor);
    let lines = events
        .iter()
        .filter_map(|event| request.view(event))
        .map(|(kind, object)| event_line(kind, &object))
        .collect();
    Ok((lines, next))
}
