//! What the publisher needs to know about its Node object: the uid (for the slices' owner
//! reference) and whether the node opted into topology-managed allocation (its label). Kept
//! current by a watch on the one Node.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tessera_api::names::TOPOLOGY_MANAGED_LABEL;
use tessera_process::Stop;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The Node's facts that shape the published pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedNode {
    pub name: String,
    pub uid: String,
    /// The node carries `gpu.tessera.dev/topology-managed=true`.
    pub topology_managed: bool,
}

impl WatchedNode {
    /// The facts of `node`; `None` if it has no uid (not stored by an API server).
    pub fn of(node: &Node) -> Option<Self> {
        Some(Self {
            name: node.name_any(),
            uid: node.uid()?,
            topology_managed: node
                .labels()
                .get(TOPOLOGY_MANAGED_LABEL)
                .is_some_and(|value| value == "true"),
        })
    }
}

/// Watches the Node `name` and keeps the returned channel at its facts (`None` while the Node
/// does not exist). The task runs until `stop` is cancelled; watch errors are logged and
/// retried with backoff.
pub fn watch_node(
    client: kube::Client,
    name: &str,
    stop: Stop,
) -> (watch::Receiver<Option<WatchedNode>>, JoinHandle<()>) {
    let (facts, receiver) = watch::channel(None);
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    let task = tokio::spawn(async move {
        let mut events = watcher(nodes, config)
            .default_backoff()
            .take_until(stop.cancelled_owned())
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                    let found = WatchedNode::of(&node);
                    facts.send_if_modified(|current| {
                        let changed = *current != found;
                        *current = found;
                        changed
                    });
                }
                Ok(watcher::Event::Delete(_)) => {
                    tracing::warn!(node = %name, "the Node object was deleted");
                    facts.send_replace(None);
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                Err(error) => {
                    tracing::warn!(node = %name, %error, "watching the Node failed; retrying");
                }
            }
        }
    });
    (receiver, task)
}
