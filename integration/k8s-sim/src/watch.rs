//! Watches: which events a watch sends ([`WatchCursor`], a pure state
//! machine over the store) and the async stream the server sends them on
//! (`stream`), one JSON object per line, woken by store changes.
//!
//! Semantics, as a real API server: no `resourceVersion` (or `0`) starts
//! with a synthetic `ADDED` per existing object; `resourceVersion=N`
//! resumes with the events after N, or a single `ERROR` event carrying a
//! 410 `Expired` Status when those are no longer kept (then the stream
//! ends); an object modified so that it stops (starts) matching the
//! selectors is sent as `DELETED` (`ADDED`); `allowWatchBookmarks` adds a
//! `BOOKMARK` every [`BOOKMARK_INTERVAL`]; `sendInitialEvents=true` ends the
//! initial events with a bookmark annotated `k8s.io/initial-events-end`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Shared;
use super::meta::rfc3339;
use super::resources::ResourceDef;
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{Event, EventType, Store};
use super::table;

/// How often a watch with `allowWatchBookmarks` gets a bookmark.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(10);

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Synthetic ADDED events for the current objects, then changes.
    Now,
    /// Like `Now`, then a bookmark marking the end of the initial events.
    InitialEvents,
    /// The changes after this resourceVersion.
    From(u64),
}

/// What one watch selects.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    /// The collection watched.
    pub res: &'static ResourceDef,
    /// `None`: every namespace (or a cluster-scoped kind).
    pub namespace: Option<String>,
    /// Only objects whose labels match.
    pub labels: LabelSelector,
    /// Only objects whose fields match.
    pub fields: FieldSelector,
    /// Where the event stream starts.
    pub start: WatchStart,
    /// Whether to send `BOOKMARK` events.
    pub bookmarks: bool,
    /// When the server ends the watch (`timeoutSeconds`).
    pub timeout: Duration,
    /// Send each object as a one-row `Table` (`kubectl get -w`).
    pub table: bool,
}

/// A watch's position: the resourceVersion up to which it has looked at
/// every event.
#[derive(Debug)]
pub struct WatchCursor {
    spec: WatchSpec,
    rv: u64,
}

impl WatchCursor {
    /// Starts a watch: the initial events (ADDED or, if the start version
    /// is gone, one ERROR). `Err` means "send this ERROR event and stop".
    pub fn start(spec: WatchSpec, store: &Store) -> (WatchCursor, Result<Vec<Value>, Value>) {
        let mut cursor = WatchCursor { rv: 0, spec };
        let frames = match cursor.spec.start {
            WatchStart::Now | WatchStart::InitialEvents => {
                cursor.rv = store.resource_version();
                let mut frames: Vec<Value> = store
                    .list(
                        cursor.spec.res,
                        cursor.spec.namespace.as_deref(),
                        &cursor.spec.labels,
                        &cursor.spec.fields,
                    )
                    .into_iter()
                    .map(|o| frame("ADDED", o.clone()))
                    .collect();
                if cursor.spec.start == WatchStart::InitialEvents {
                    let mut b = cursor.bookmark();
                    b["object"]["metadata"]["annotations"] =
                        json!({"k8s.io/initial-events-end": "true"});
                    frames.push(b);
                }
                Ok(frames)
            }
            WatchStart::From(rv) => {
                cursor.rv = rv;
                cursor.poll(store)
            }
        };
        (cursor, frames)
    }

    /// The events since the last poll that this watch selects.
    pub fn poll(&mut self, store: &Store) -> Result<Vec<Value>, Value> {
        let events = store.events_since(self.rv).map_err(|e| error_frame(&e))?;
        let frames = events.filter_map(|e| self.select(e)).collect();
        self.rv = self.rv.max(store.resource_version());
        Ok(frames)
    }

    /// A BOOKMARK at the cursor.
    pub fn bookmark(&self) -> Value {
        json!({"type": "BOOKMARK", "object": {
            "kind": self.spec.res.kind,
            "apiVersion": self.spec.res.api_version(),
            "metadata": {"resourceVersion": self.rv.to_string()},
        }})
    }

    fn matches(&self, object: &Value) -> bool {
        let ns_ok = self.spec.namespace.as_deref().is_none_or(|ns| {
            object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                == Some(ns)
        });
        ns_ok && self.spec.labels.matches(object) && self.spec.fields.matches(object)
    }

    fn select(&self, e: &Event) -> Option<Value> {
        if e.res != self.spec.res {
            return None;
        }
        let now = self.matches(&e.object);
        let kind = match e.kind {
            EventType::Added if now => "ADDED",
            EventType::Deleted if now => "DELETED",
            EventType::Modified => {
                let before = e.prev.as_ref().is_some_and(|p| self.matches(p));
                match (before, now) {
                    (true, true) => "MODIFIED",
                    (false, true) => "ADDED",
                    (true, false) => "DELETED",
                    (false, false) => return None,
                }
            }
            _ => return None,
        };
        Some(frame(kind, e.object.clone()))
    }
}

fn frame(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

fn error_frame(e: &ApiError) -> Value {
    frame("ERROR", e.to_status())
}

/// One event as a line; objects as one-row Tables if the watch asked.
fn line(v: &Value, table_of: Option<&'static ResourceDef>) -> Bytes {
    let mut v = v.clone();
    let is_object_event = matches!(v["type"].as_str(), Some("ADDED" | "MODIFIED" | "DELETED"));
    if let Some(res) = table_of.filter(|_| is_object_event) {
        let now = rfc3339(SystemTime::now());
        v["object"] = table::of_objects(res, &[&v["object"]], &now);
    }
    let mut b = v.to_string().into_bytes();
    b.push(b'\n');
    Bytes::from(b)
}

struct Streaming {
    shared: Arc<Shared>,
    cursor: WatchCursor,
    changes: tokio::sync::watch::Receiver<u64>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    deadline: Instant,
    next_bookmark: Instant,
    pending: VecDeque<Bytes>,
    done: bool,
}

/// Starts a watch and returns its body: the initial events, then changes
/// as the store reports them, until the timeout, an ERROR, shutdown or the
/// client's disconnect (which drops the stream).
pub(crate) fn stream(
    shared: Arc<Shared>,
    spec: WatchSpec,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static {
    // Subscribe before reading the store, so no change falls in between.
    let changes = shared.changes.subscribe();
    let shutdown = shared.shutdown.subscribe();
    let timeout = spec.timeout;
    let (cursor, first) = {
        let store = shared.lock_store();
        WatchCursor::start(spec, &store)
    };
    let now = Instant::now();
    let mut state = Streaming {
        shared,
        cursor,
        changes,
        shutdown,
        deadline: now + timeout,
        next_bookmark: now + BOOKMARK_INTERVAL,
        pending: VecDeque::new(),
        done: false,
    };
    state.push(first);
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(bytes) = s.pending.pop_front() {
                return Some((Ok(Frame::data(bytes)), s));
            }
            if s.done {
                return None;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(s.deadline) => s.done = true,
                _ = s.shutdown.changed() => s.done = true,
                changed = s.changes.changed() => {
                    if changed.is_err() {
                        s.done = true;
                    } else {
                        let polled = {
                            let store = s.shared.lock_store();
                            s.cursor.poll(&store)
                        };
                        s.push(polled);
                    }
                }
                _ = tokio::time::sleep_until(s.next_bookmark), if s.cursor.spec.bookmarks => {
                    s.next_bookmark += BOOKMARK_INTERVAL;
                    let b = line(&s.cursor.bookmark(), None);
                    s.pending.push_back(b);
                }
            }
        }
    })
}

impl Streaming {
    fn push(&mut self, frames: Result<Vec<Value>, Value>) {
        let table_of = self.cursor.spec.table.then_some(self.cursor.spec.res);
        match frames {
            Ok(frames) => self
                .pending
                .extend(frames.iter().map(|f| line(f, table_of))),
            Err(error) => {
                self.pending.push_back(line(&error, None));
                self.done = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::PODS;
    use crate::store::{Key, Part, WriteOpts};

    const NOW: &str = "2024-01-01T00:00:00Z";

    fn spec(start: WatchStart, labels: &str) -> WatchSpec {
        WatchSpec {
            res: &PODS,
            namespace: Some("default".into()),
            labels: LabelSelector::parse(labels).unwrap(),
            fields: FieldSelector::default(),
            start,
            bookmarks: false,
            timeout: Duration::from_secs(1),
            table: false,
        }
    }

    fn pod(name: &str, app: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"app": app}}})
    }

    fn types(frames: &[Value]) -> Vec<String> {
        frames
            .iter()
            .map(|f| {
                format!(
                    "{} {}",
                    f["type"].as_str().unwrap(),
                    f["object"]["metadata"]["name"].as_str().unwrap_or("")
                )
            })
            .collect()
    }

    #[test]
    fn resumes_after_a_version_and_expires_old_ones() {
        let mut store = Store::new(4, 1);
        store
            .create(&PODS, "default", pod("a", "x"), NOW, WriteOpts::default())
            .unwrap(); // ns rv 1, pod rv 2
        let (mut w, first) = WatchCursor::start(spec(WatchStart::Now, "app=x"), &store);
        assert_eq!(types(&first.unwrap()), ["ADDED a"]);
        store
            .create(&PODS, "default", pod("b", "x"), NOW, WriteOpts::default())
            .unwrap(); // rv 3
        store
            .create(&PODS, "default", pod("c", "y"), NOW, WriteOpts::default())
            .unwrap(); // rv 4
        assert_eq!(types(&w.poll(&store).unwrap()), ["ADDED b"]);
        // Relabelling b out of the selector is a DELETED for this watch.
        let key = Key::new(&PODS, "default", "b");
        store
            .update(&key, pod("b", "y"), Part::Main, WriteOpts::default())
            .unwrap(); // rv 5
        assert_eq!(types(&w.poll(&store).unwrap()), ["DELETED b"]);

        // Resume from rv 3: sees the relabel of b only.
        let (_, resumed) = WatchCursor::start(spec(WatchStart::From(3), "app=x"), &store);
        assert_eq!(types(&resumed.unwrap()), ["DELETED b"]);
        // Five more writes push rv 5 out of a 4-event history.
        for i in 0..5 {
            store
                .create(
                    &PODS,
                    "default",
                    pod(&format!("z{i}"), "z"),
                    NOW,
                    WriteOpts::default(),
                )
                .unwrap();
        }
        let (_, gone) = WatchCursor::start(spec(WatchStart::From(3), "app=x"), &store);
        let err = gone.unwrap_err();
        assert_eq!(err["type"], "ERROR");
        assert_eq!(err["object"]["code"], 410);
        assert_eq!(err["object"]["reason"], "Expired");
        // The watch that kept up is told too, once it falls behind.
        let err = w.poll(&store).unwrap_err();
        assert_eq!(err["object"]["code"], 410);
    }

    #[test]
    fn initial_events_end_with_a_bookmark() {
        let mut store = Store::new(10, 1);
        store
            .create(&PODS, "default", pod("a", "x"), NOW, WriteOpts::default())
            .unwrap();
        let (_, first) = WatchCursor::start(spec(WatchStart::InitialEvents, ""), &store);
        let first = first.unwrap();
        assert_eq!(first.len(), 2);
        assert_eq!(first[1]["type"], "BOOKMARK");
        assert_eq!(first[1]["object"]["metadata"]["resourceVersion"], "2");
        assert_eq!(
            first[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }
}
