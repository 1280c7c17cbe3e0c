//! The running discovery streams of the node agent, one per configuration (v1 or v0), each
//! forwarding its handler's reports as [`StreamEvent`]s.

use crate::discovery::{
    DiscoveryEvent, DiscoveryRequest, DiscoveryStream, RegisteredHandler, StreamConfig,
};
use std::collections::{BTreeMap, BTreeSet};
use tokio::sync::mpsc;

/// What a stream runs with; a change restarts it.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamSpec {
    pub handler: RegisteredHandler,
    pub details: String,
    /// The resolved discovery properties.
    pub properties: BTreeMap<String, Vec<u8>>,
    pub capacity: i32,
    pub unique_devices: bool,
}

/// Something a discovery stream said about its configuration.
pub struct StreamEvent {
    /// The key the stream was started under.
    pub configuration: String,
    pub handler: RegisteredHandler,
    pub capacity: i32,
    pub unique_devices: bool,
    pub event: DiscoveryEvent,
}

struct Running {
    spec: StreamSpec,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Streams by key.
#[derive(Default)]
pub struct Streams {
    running: BTreeMap<String, Running>,
}

impl Streams {
    pub fn contains(&self, key: &str) -> bool {
        self.running.contains_key(key)
    }

    /// The properties the stream of `key` runs with.
    pub fn properties(&self, key: &str) -> Option<&BTreeMap<String, Vec<u8>>> {
        self.running.get(key).map(|r| &r.spec.properties)
    }

    /// Runs a stream for `key` with `spec`, restarting it if it ran with another spec.
    /// Returns whether a stream was (re)started.
    pub fn ensure(
        &mut self,
        key: &str,
        spec: StreamSpec,
        events: &mpsc::Sender<StreamEvent>,
    ) -> bool {
        if self.running.get(key).is_some_and(|r| r.spec == spec) {
            return false;
        }
        let request = DiscoveryRequest {
            details: spec.details.clone(),
            properties: spec.properties.clone(),
        };
        let mut stream =
            DiscoveryStream::start(spec.handler.clone(), request, StreamConfig::default());
        let events = events.clone();
        let (configuration, handler, capacity, unique_devices) = (
            key.to_string(),
            spec.handler.clone(),
            spec.capacity,
            spec.unique_devices,
        );
        let task = tokio::spawn(async move {
            while let Some(event) = stream.next_event().await {
                let event = StreamEvent {
                    configuration: configuration.clone(),
                    handler: handler.clone(),
                    capacity,
                    unique_devices,
                    event,
                };
                if events.send(event).await.is_err() {
                    return;
                }
            }
        });
        self.running.insert(key.to_string(), Running { spec, task });
        true
    }

    /// Stops the streams not in `wanted`; returns their keys.
    pub fn stop_others(&mut self, wanted: &BTreeSet<String>) -> Vec<String> {
        let stale: Vec<String> = self
            .running
            .keys()
            .filter(|k| !wanted.contains(*k))
            .cloned()
            .collect();
        for key in &stale {
            self.running.remove(key);
        }
        stale
    }
}
