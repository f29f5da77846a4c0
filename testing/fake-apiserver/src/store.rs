//! The object store: JSON objects keyed by resource type, namespace and name, a global
//! resourceVersion counter (like etcd's revision), and the event history watches replay.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value};

use crate::resources::ResourceType;

/// Events kept for watches that resume from an older resourceVersion.
pub const DEFAULT_HISTORY_LIMIT: usize = 2_000;

/// Where an object lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The resource type's group.
    pub group: &'static str,
    /// The resource type's plural.
    pub plural: &'static str,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl ObjectKey {
    /// The key of `name` in `namespace` (ignored for cluster-scoped types).
    pub fn new(resource: &ResourceType, namespace: Option<&str>, name: &str) -> Self {
        Self {
            group: resource.group,
            plural: resource.plural,
            namespace: if resource.namespaced {
                namespace.unwrap_or_default().to_owned()
            } else {
                String::new()
            },
            name: name.to_owned(),
        }
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as watches see it.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// The resourceVersion the change produced.
    pub resource_version: u64,
    pub resource: &'static ResourceType,
    pub event_type: EventType,
    /// The object before the change (modifications and deletions).
    pub old: Option<Arc<Value>>,
    /// The object after the change; for deletions the last state, with the deletion's
    /// resourceVersion.
    pub new: Arc<Value>,
}

/// The stored objects and their history. Objects are shared (`Arc`) between the map and the
/// history, so that a write clones no object.
#[derive(Debug)]
pub struct Store {
    objects: BTreeMap<ObjectKey, Arc<Value>>,
    /// The last configuration each field manager applied to each object (server-side apply).
    applied: HashMap<(ObjectKey, String, bool), Value>,
    resource_version: u64,
    history: VecDeque<StoredEvent>,
    /// Events with a resourceVersion above this are in `history`.
    history_floor: u64,
    history_limit: usize,
    uids: u64,
    generated_names: u64,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            applied: HashMap::new(),
            resource_version: 1,
            history: VecDeque::new(),
            history_floor: 1,
            history_limit: DEFAULT_HISTORY_LIMIT,
            uids: 0,
            generated_names: 0,
        }
    }
}

impl Store {
    /// The newest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// Forgets the event history: watches resuming from any earlier resourceVersion get 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.history_floor = self.resource_version;
    }

    /// Sets how many events the history keeps.
    pub fn set_history_limit(&mut self, limit: usize) {
        self.history_limit = limit.max(1);
        self.trim_history();
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(key).map(Arc::as_ref)
    }

    /// The stored object, shared.
    pub fn get_shared(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        self.objects.get(key).cloned()
    }

    /// The objects of `resource` (in `namespace`, or all), ordered by namespace and name.
    pub fn list<'a>(
        &'a self,
        resource: &'a ResourceType,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Value)> + 'a {
        self.objects
            .iter()
            .filter(move |(key, _)| {
                key.group == resource.group
                    && key.plural == resource.plural
                    && namespace.is_none_or(|ns| !resource.namespaced || key.namespace == ns)
            })
            .map(|(key, object)| (key, object.as_ref()))
    }

    /// Events after `resource_version`, or `None` if some of them are gone from the history.
    pub fn events_after(&self, resource_version: u64) -> Option<Vec<StoredEvent>> {
        if resource_version < self.history_floor {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|event| event.resource_version > resource_version)
                .cloned()
                .collect(),
        )
    }

    /// A fresh UID.
    pub fn next_uid(&mut self) -> String {
        self.uids += 1;
        format!("f4ce0000-0000-4000-8000-{:012x}", self.uids)
    }

    /// A name for `generateName`: the prefix plus five characters.
    pub fn generate_name(&mut self, prefix: &str) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        self.generated_names += 1;
        let mut n = self.generated_names;
        let mut suffix = String::new();
        for _ in 0..5 {
            suffix.push(ALPHABET[(n % ALPHABET.len() as u64) as usize] as char);
            n /= ALPHABET.len() as u64;
        }
        format!("{prefix}{suffix}")
    }

    /// The configuration `manager` last applied to the object (`status`: to its status).
    pub fn applied(&self, key: &ObjectKey, manager: &str, status: bool) -> Option<&Value> {
        self.applied.get(&(key.clone(), manager.to_owned(), status))
    }

    /// Records what `manager` applied.
    pub fn record_applied(&mut self, key: &ObjectKey, manager: &str, status: bool, config: Value) {
        self.applied
            .insert((key.clone(), manager.to_owned(), status), config);
    }

    /// Stores a new object: sets uid (unless present), creationTimestamp, generation 1 and a new
    /// resourceVersion, and records an ADDED event. Returns the stored object.
    pub fn insert(
        &mut self,
        resource: &'static ResourceType,
        key: ObjectKey,
        mut object: Value,
    ) -> Arc<Value> {
        let resource_version = self.bump();
        let uid = self.next_uid();
        let meta = metadata_mut(&mut object);
        meta.entry("uid").or_insert_with(|| Value::String(uid));
        meta.insert("creationTimestamp".into(), Value::String(now()));
        meta.insert("generation".into(), Value::from(1));
        meta.insert(
            "resourceVersion".into(),
            Value::String(resource_version.to_string()),
        );
        let object = Arc::new(object);
        self.objects.insert(key, Arc::clone(&object));
        self.record(resource, EventType::Added, None, Arc::clone(&object));
        object
    }

    /// Replaces an existing object with `object` (whose server-owned metadata the caller has
    /// already carried over): bumps the resourceVersion, bumps the generation when anything
    /// outside metadata and status changed, and records a MODIFIED event. An object marked for
    /// deletion whose last finalizer is gone is deleted instead. Returns the stored object.
    pub fn replace(
        &mut self,
        resource: &'static ResourceType,
        key: &ObjectKey,
        mut object: Value,
    ) -> Arc<Value> {
        let Some(old) = self.objects.get(key).cloned() else {
            return self.insert(resource, key.clone(), object);
        };
        let resource_version = self.bump();
        let generation = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if same_outside_meta_and_status(&old, &object) {
            generation
        } else {
            generation + 1
        };
        let meta = metadata_mut(&mut object);
        meta.insert("generation".into(), Value::from(generation));
        meta.insert(
            "resourceVersion".into(),
            Value::String(resource_version.to_string()),
        );
        let finished = meta.contains_key("deletionTimestamp")
            && meta
                .get("finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
        let object = Arc::new(object);
        if finished {
            self.objects.remove(key);
            self.forget_applied(key);
            self.record(resource, EventType::Deleted, Some(old), Arc::clone(&object));
        } else {
            self.objects.insert(key.clone(), Arc::clone(&object));
            self.record(
                resource,
                EventType::Modified,
                Some(old),
                Arc::clone(&object),
            );
        }
        object
    }

    /// Removes an object, recording a DELETED event that carries a new resourceVersion.
    pub fn remove(
        &mut self,
        resource: &'static ResourceType,
        key: &ObjectKey,
    ) -> Option<Arc<Value>> {
        let old = self.objects.remove(key)?;
        self.forget_applied(key);
        let resource_version = self.bump();
        let mut last = Value::clone(&old);
        metadata_mut(&mut last).insert(
            "resourceVersion".into(),
            Value::String(resource_version.to_string()),
        );
        let last = Arc::new(last);
        self.record(resource, EventType::Deleted, Some(old), Arc::clone(&last));
        Some(last)
    }

    fn forget_applied(&mut self, key: &ObjectKey) {
        self.applied.retain(|(k, _, _), _| k != key);
    }

    fn bump(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    fn record(
        &mut self,
        resource: &'static ResourceType,
        event_type: EventType,
        old: Option<Arc<Value>>,
        new: Arc<Value>,
    ) {
        self.history.push_back(StoredEvent {
            resource_version: self.resource_version,
            resource,
            event_type,
            old,
            new,
        });
        self.trim_history();
    }

    fn trim_history(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.history_floor = dropped.resource_version;
            }
        }
    }
}

/// `metadata` of an object as a mutable map, created if missing or not a map.
pub fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = Value::Object(Map::new());
    }
    let map = object.as_object_mut().expect("made an object above");
    let meta = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut().expect("made an object above")
}

/// Whether two objects agree outside `metadata` and `status`: what `metadata.generation`
/// tracks.
fn same_outside_meta_and_status(a: &Value, b: &Value) -> bool {
    let tracked = |key: &&String| !matches!(key.as_str(), "metadata" | "status");
    match (a.as_object(), b.as_object()) {
        (Some(a), Some(b)) => {
            a.keys().filter(tracked).count() == b.keys().filter(tracked).count()
                && a.iter()
                    .filter(|(k, _)| tracked(k))
                    .all(|(k, v)| b.get(k) == Some(v))
        }
        _ => a == b,
    }
}

/// The current time as the API server writes timestamps (RFC 3339, seconds, UTC).
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources::by_name;

    #[test]
    fn generation_follows_spec_and_history_replays() {
        let nodes = by_name("nodes").unwrap();
        let mut store = Store::default();
        let key = ObjectKey::new(nodes, None, "n");
        let created = store.insert(
            nodes,
            key.clone(),
            json!({"metadata": {"name": "n"}, "spec": {}}),
        );
        let start = store.resource_version();
        assert_eq!(created["metadata"]["generation"], 1);
        assert_eq!(created["metadata"]["resourceVersion"], start.to_string());

        let mut labelled = Value::clone(&created);
        labelled["metadata"]["labels"] = json!({"a": "b"});
        let labelled = store.replace(nodes, &key, labelled);
        assert_eq!(labelled["metadata"]["generation"], 1);

        let mut changed = Value::clone(&labelled);
        changed["spec"]["unschedulable"] = json!(true);
        let changed = store.replace(nodes, &key, changed);
        assert_eq!(changed["metadata"]["generation"], 2);

        let events = store.events_after(start).unwrap();
        assert_eq!(events.len(), 2);
        assert!(events.iter().all(|e| e.event_type == EventType::Modified));

        store.compact();
        assert!(store.events_after(start).is_none());
        assert_eq!(
            store.events_after(store.resource_version()).unwrap().len(),
            0
        );
    }

    #[test]
    fn last_finalizer_removal_deletes_a_terminating_object() {
        let pods = by_name("pods").unwrap();
        let mut store = Store::default();
        let key = ObjectKey::new(pods, Some("ns"), "p");
        let pod = store.insert(
            pods,
            key.clone(),
            json!({"metadata": {"name": "p", "namespace": "ns", "finalizers": ["x"], "deletionTimestamp": now()}}),
        );
        let mut pod = Value::clone(&pod);
        pod["metadata"]["finalizers"] = json!([]);
        store.replace(pods, &key, pod);
        assert!(store.get(&key).is_none());
        let last = store.events_after(1).unwrap().pop().unwrap();
        assert_eq!(last.event_type, EventType::Deleted);
    }

    #[test]
    fn history_is_bounded() {
        let nodes = by_name("nodes").unwrap();
        let mut store = Store::default();
        store.set_history_limit(2);
        for name in ["a", "b", "c"] {
            store.insert(
                nodes,
                ObjectKey::new(nodes, None, name),
                json!({"metadata": {"name": name}}),
            );
        }
        assert!(store.events_after(1).is_none());
        assert_eq!(store.events_after(store.history_floor).unwrap().len(), 2);
        assert_eq!(store.generate_name("x-").len(), 7);
    }
}
