//! Status conditions shared by the v1 kinds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition type: the object has been fully acted on (devices published, filter compiled...).
pub const CONDITION_READY: &str = "Ready";
/// Condition type: something in the spec or the environment is wrong; `message` says what.
pub const CONDITION_DEGRADED: &str = "Degraded";

/// Sets (or replaces) the condition of `type_`, keeping `lastTransitionTime` when the status
/// did not change, as the Kubernetes API conventions ask. Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> bool {
    let status = if status { "True" } else { "False" }.to_string();
    let message = message.into();
    let existing = conditions.iter_mut().find(|c| c.type_ == type_);
    match existing {
        Some(c)
            if c.status == status
                && c.reason == reason
                && c.message == message
                && c.observed_generation == observed_generation =>
        {
            false
        }
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(Timestamp::now());
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = observed_generation;
            true
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status,
                reason: reason.to_string(),
                message,
                observed_generation,
                last_transition_time: Time(Timestamp::now()),
            });
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_transition_time_when_status_is_unchanged() {
        let mut conditions = Vec::new();
        assert!(set_condition(
            &mut conditions,
            CONDITION_READY,
            true,
            "Published",
            "3 devices",
            Some(1)
        ));
        let first = conditions[0].last_transition_time.clone();
        assert!(!set_condition(
            &mut conditions,
            CONDITION_READY,
            true,
            "Published",
            "3 devices",
            Some(1)
        ));
        assert!(set_condition(
            &mut conditions,
            CONDITION_READY,
            true,
            "Published",
            "4 devices",
            Some(2)
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, first);
        assert_eq!(conditions[0].message, "4 devices");
        assert!(set_condition(
            &mut conditions,
            CONDITION_READY,
            false,
            "HandlerMissing",
            "no handler",
            Some(2)
        ));
        assert_eq!(conditions[0].status, "False");
        assert!(conditions[0].last_transition_time.0 >= first.0);
    }
}
