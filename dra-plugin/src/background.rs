//! What goes wrong in a plugin's background work, where no kubelet call can return it: a
//! claim's device status not written, the node's slices not repaired, the registration not
//! made again. The library logs each and retries; the driver hears of each through
//! [`Driver::background_error`](crate::Driver::background_error), as a Go driver does through
//! upstream's helper's `HandleError`, to count it, report it (a Node event, a metric) or stop.

use std::sync::Arc;

/// One error of the plugin's background work. More kinds may come: match with a wildcard.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackgroundError {
    /// A claim's `status.devices` entries could not be written (retried with backoff).
    #[error("could not write the device status of claim {claim}: {error}")]
    DeviceStatus {
        /// The claim.
        claim: crate::ClaimRef,
        /// What the API server said, or that it did not answer in time.
        error: String,
    },
    /// The node's ResourceSlices, changed behind the plugin's back, could not be repaired
    /// (tried again on the next change).
    #[error("could not repair the node's ResourceSlices: {0}")]
    SliceRepair(String),
    /// The registration socket could not be made again after the kubelet lost it (tried again
    /// every few seconds).
    #[error("could not register with the kubelet again: {0}")]
    Registration(String),
}

/// Where the background tasks send their errors: the driver's hook.
#[derive(Clone)]
pub(crate) struct Errors(Arc<dyn Fn(&BackgroundError) + Send + Sync>);

impl Errors {
    /// To `driver`'s [`background_error`](crate::Driver::background_error).
    pub(crate) fn of<D: crate::Driver>(driver: &Arc<D>) -> Errors {
        let driver = driver.clone();
        Errors(Arc::new(move |error| driver.background_error(error)))
    }

    /// Nowhere but the log (a writer started on its own).
    pub(crate) fn logged_only() -> Errors {
        Errors(Arc::new(|_| {}))
    }

    /// Tells the driver (the caller has logged it).
    pub(crate) fn report(&self, error: BackgroundError) {
        (self.0)(&error);
    }
}
