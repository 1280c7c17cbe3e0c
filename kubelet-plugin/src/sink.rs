//! What the loop asks of each sink on a pass ([`ApplyPlan`]: observe, then apply its part of
//! the plan), how each says where it stands ([`Standing`]), and the node's readiness from
//! that ([`readiness`]).

use crate::device_plan::{DevicePlan, NodeState};
use crate::discovery::Handlers;
use crate::node_discovery::NodeDiscovery;
use crate::node_plan::NodePlan;

/// What a pass hands each sink: the plan, the handlers registered now, the node's discovery
/// (the devices it keeps and its start-up gate) and whether this agent leads the node.
pub(crate) struct Pass<'a> {
    pub plan: &'a NodePlan,
    pub handlers: &'a Handlers,
    pub discovery: &'a mut NodeDiscovery,
    pub leading: bool,
}

/// Where a sink stands after applying its part of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    Serving,
    /// Its start-up gate is closed: its handlers have not reported yet, and what a previous
    /// process published is kept meanwhile.
    Starting,
    /// Standing by, the kubelet has not taken this pod's plugins yet.
    WaitingForKubelet,
    /// Not ready, with why (a kubelet refused a driver, or took none in time).
    Problem(String),
}

/// A sink of the node's discovery. On a pass it first reads its part of the node's state
/// ([`observe`](Self::observe)); the loop plans from every sink's part
/// ([`DevicePlan::of`]); then it applies its part of that plan ([`apply`](Self::apply)),
/// writing (when leading) or only serving (standing by).
pub(crate) trait ApplyPlan {
    /// Gets ready for the pass (serves what the handlers registered need) and adds its part
    /// of the node's state to `state`; or says where it stands when it has nothing to apply
    /// on this pass (its start-up gate is closed, or it stands by with nothing to serve from
    /// a plan).
    async fn observe<'s>(&'s mut self, pass: &mut Pass<'_>, state: &mut NodeState<'s>) -> Observed;

    /// Applies its part of `plan` (taking it out).
    async fn apply(&mut self, pass: &mut Pass<'_>, plan: &mut DevicePlan) -> Applied;
}

/// What [`ApplyPlan::observe`] found.
pub(crate) enum Observed {
    /// Its part is in the state: apply the plan.
    Apply,
    /// Nothing to apply on this pass; it stands so.
    Stands(Standing),
}

/// What [`ApplyPlan::apply`] did.
pub(crate) struct Applied {
    pub standing: Standing,
    /// A write renamed devices (another node's unshared device has their name): the loop
    /// plans once more, so that they are written under their new names at once.
    pub again: bool,
}

impl From<Standing> for Applied {
    fn from(standing: Standing) -> Self {
        Applied {
            standing,
            again: false,
        }
    }
}

/// The node's readiness from its sinks' standings: `Some(Ok)` ready, `Some(Err(why))` not
/// ready, `None` unchanged (a configuration watch fails, and said so when it did). Starting
/// first (nothing else is known yet), then a problem, then waiting for the kubelet.
pub(crate) fn readiness(standings: &[Standing], watch_failing: bool) -> Option<Result<(), String>> {
    if standings.contains(&Standing::Starting) {
        return Some(Err(
            "starting: waiting for the discovery handlers to report".into(),
        ));
    }
    if let Some(Standing::Problem(why)) =
        (standings.iter()).find(|s| matches!(s, Standing::Problem(_)))
    {
        return Some(Err(why.clone()));
    }
    if standings.contains(&Standing::WaitingForKubelet) {
        return Some(Err(
            "standing by: waiting for the kubelet to take this pod's plugins".into(),
        ));
    }
    (!watch_failing).then_some(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Standing::*;

    #[test]
    fn readiness_from_the_sinks_standings() {
        let problem = || Problem("the kubelet refused akri-debugecho".to_string());
        type Case<'a> = (&'a [Standing], bool, Option<Result<(), &'a str>>);
        let cases: [Case; 8] = [
            (&[], false, Some(Ok(()))),
            (&[Serving, Serving], false, Some(Ok(()))),
            (&[Serving], true, None),
            (
                &[Serving, Starting],
                false,
                Some(Err(
                    "starting: waiting for the discovery handlers to report",
                )),
            ),
            (
                &[problem(), Starting],
                false,
                Some(Err(
                    "starting: waiting for the discovery handlers to report",
                )),
            ),
            (
                &[WaitingForKubelet, problem()],
                false,
                Some(Err("the kubelet refused akri-debugecho")),
            ),
            (
                &[Serving, WaitingForKubelet],
                false,
                Some(Err(
                    "standing by: waiting for the kubelet to take this pod's plugins",
                )),
            ),
            (
                &[WaitingForKubelet],
                true,
                Some(Err(
                    "standing by: waiting for the kubelet to take this pod's plugins",
                )),
            ),
        ];
        for (standings, failing, expected) in cases {
            let expected = expected.map(|r| r.map_err(String::from));
            assert_eq!(
                readiness(standings, failing),
                expected,
                "{standings:?}, watch failing: {failing}"
            );
        }
    }
}
