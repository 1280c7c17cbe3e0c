//! Where the workload kinds keep their pod spec: one answer for the broker-controller (which
//! binds broker pods to their device) and the migration (which finds and rewrites requests
//! for Akri's extended resources).

/// The path to the pod spec in an object of `kind`: a Pod's own, a workload's pod template's,
/// a CronJob's job template's. `None` for kinds that run no pods.
pub fn pod_spec_path(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "Pod" => &["spec"],
        "Deployment"
        | "ReplicaSet"
        | "StatefulSet"
        | "DaemonSet"
        | "Job"
        | "ReplicationController" => &["spec", "template", "spec"],
        "CronJob" => &["spec", "jobTemplate", "spec", "template", "spec"],
        _ => return None,
    })
}
