//! Akri's slot sharing, as pure functions of the Instances: what the Instance-level (IL) and
//! Configuration-level (CL) device plugins of one node advertise, and which `deviceUsage`
//! slots an allocation claims. No I/O: [`crate::claims`] writes what these functions decide.
//!
//! - **IL** (one plugin per Instance, resource `akri.sh/<instance>`): one device per slot,
//!   id `<instance>-<i>` ([`akri_devices::slot_device_name`]). A slot is healthy when it is
//!   free or this node's IL plugin holds it; held by another node, or by a CL plugin (this
//!   node's included), it is unhealthy (seed 000).
//! - **CL, `uniqueDevices: false`**: the same slot ids, healthy when free or held by this
//!   node's CL plugin (which records the slot id as its virtual device: `C:<slot>:<node>`).
//! - **CL, `uniqueDevices: true`**: dynamic virtual device ids (seed 003): the ids this node's
//!   CL plugin holds, plus one placeholder (`"0"`, `"1"`, ... not held) per Instance with a
//!   free slot, so the kubelet cannot ask for more distinct devices than exist. `Allocate`
//!   maps ids to slots per container request: distinct Instances within a request, an id's
//!   previous slot if it holds one, otherwise a free slot of the Instance with the most free
//!   slots.

use akri_api::v0::{DeviceUsage, InstanceSpec};
use device_plugin::plugin::Device;
use std::collections::{BTreeMap, BTreeSet};

/// One Instance as the plugins see it: its slots and who holds each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSlots {
    pub name: String,
    /// By slot id. `None`: a value that does not parse; such a slot is never free and never
    /// ours, so it is neither handed out nor freed by this node.
    pub slots: BTreeMap<String, Option<DeviceUsage>>,
}

impl InstanceSlots {
    pub fn new(name: &str, spec: &InstanceSpec) -> Self {
        InstanceSlots {
            name: name.to_string(),
            slots: spec
                .slot_usages()
                .map(|(slot, usage)| (slot.to_string(), usage.ok()))
                .collect(),
        }
    }

    fn usage(&self, slot: &str) -> Option<&DeviceUsage> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    fn free_slots(&self) -> impl Iterator<Item = &str> {
        // Slot order by number, not by string: `-10` after `-9`.
        let mut free: Vec<(i32, &str)> = self
            .slots
            .iter()
            .filter(|(_, usage)| usage.as_ref().is_some_and(DeviceUsage::is_free))
            .map(|(slot, _)| {
                let n = akri_devices::parse_slot_device_name(slot).map_or(i32::MAX, |(_, n)| n);
                (n, slot.as_str())
            })
            .collect();
        free.sort();
        free.into_iter().map(|(_, slot)| slot)
    }

    fn free_count(&self) -> usize {
        self.free_slots().count()
    }
}

/// One slot an allocation uses: the value it has now, and the value it gets. Equal when the
/// slot is already held as wanted (the kubelet allocating again after a restart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotClaim {
    pub instance: String,
    pub slot: String,
    pub from: DeviceUsage,
    pub to: DeviceUsage,
}

impl SlotClaim {
    /// Whether the claim changes the Instance.
    pub fn writes(&self) -> bool {
        self.from != self.to
    }
}

/// Why an allocation cannot be made; the kubelet shows the message in the pod's events.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    #[error("device {0} is not offered here")]
    Unknown(String),
    #[error("slot {slot} is held by {holder}")]
    Taken { slot: String, holder: String },
    #[error("slot {0} has a malformed deviceUsage value; it is left alone")]
    Malformed(String),
    #[error("device {0} is requested twice")]
    Duplicate(String),
    #[error(
        "{requested} distinct devices requested in one container, but only {available} have a free slot"
    )]
    NotEnoughDevices { requested: usize, available: usize },
    #[error("{0:?} is not a valid virtual device id")]
    InvalidId(String),
}

/// What the IL plugin of `instance` advertises on `node`.
pub fn instance_devices(instance: &InstanceSlots, node: &str) -> Vec<Device> {
    slot_devices(instance, |usage| {
        usage.is_free() || (usage.is_instance_level() && usage.is_held_by(node))
    })
}

/// What the CL plugin of a configuration advertises on `node`.
pub fn configuration_devices(instances: &[InstanceSlots], node: &str, unique: bool) -> Vec<Device> {
    if !unique {
        return instances
            .iter()
            .flat_map(|instance| {
                slot_devices(instance, |usage| {
                    usage.is_free() || (usage.is_configuration_level() && usage.is_held_by(node))
                })
            })
            .collect();
    }
    let held = held_virtual_devices(instances, node);
    let with_free_slot = instances.iter().filter(|i| i.free_count() > 0).count();
    let mut devices: Vec<Device> = held.keys().map(|id| Device::healthy(id.clone())).collect();
    devices.extend(
        placeholders(&held)
            .take(with_free_slot)
            .map(Device::healthy),
    );
    devices.sort_by_key(|d| natural(&d.id));
    devices
}

/// The slots an IL plugin's `Allocate` claims for one container.
pub fn allocate_instance(
    instance: &InstanceSlots,
    node: &str,
    ids: &[String],
) -> Result<Vec<SlotClaim>, AllocationError> {
    let to = DeviceUsage::instance(node).expect("the node name is valid");
    let mut seen = BTreeSet::new();
    ids.iter()
        .map(|id| {
            if !seen.insert(id) {
                return Err(AllocationError::Duplicate(id.clone()));
            }
            claim_slot(instance, id, &to, |usage| usage == &to)
        })
        .collect()
}

/// The slots a CL plugin's `Allocate` claims, per container request.
pub fn allocate_configuration(
    instances: &[InstanceSlots],
    node: &str,
    unique: bool,
    requests: &[Vec<String>],
) -> Result<Vec<Vec<SlotClaim>>, AllocationError> {
    let mut seen = BTreeSet::new();
    for id in requests.iter().flatten() {
        if !seen.insert(id) {
            return Err(AllocationError::Duplicate(id.clone()));
        }
    }
    if !unique {
        return requests
            .iter()
            .map(|ids| {
                ids.iter()
                    .map(|id| {
                        let instance = instance_of_slot(instances, id)?;
                        let to = DeviceUsage::configuration(id.clone(), node)
                            .map_err(|_| AllocationError::InvalidId(id.clone()))?;
                        claim_slot(instance, id, &to, |usage| usage == &to)
                    })
                    .collect()
            })
            .collect();
    }

    let held = held_virtual_devices(instances, node);
    // Free slots left, per Instance, as this call takes them.
    let mut free: BTreeMap<&str, Vec<&str>> = instances
        .iter()
        .map(|i| (i.name.as_str(), i.free_slots().collect()))
        .collect();
    let mut answer = Vec::new();
    for ids in requests {
        let available = distinct_available(&free, &held, ids);
        let too_many = AllocationError::NotEnoughDevices {
            requested: ids.len(),
            available,
        };
        let mut used: BTreeSet<&str> = BTreeSet::new();
        let mut claims = Vec::new();
        // Ids this node holds keep their slot.
        for id in ids.iter().filter(|id| held.contains_key(*id)) {
            let (instance, slot) = &held[id];
            if !used.insert(instance) {
                return Err(too_many);
            }
            let usage = DeviceUsage::configuration(id.clone(), node)
                .map_err(|_| AllocationError::InvalidId(id.clone()))?;
            claims.push(SlotClaim {
                instance: instance.to_string(),
                slot: slot.to_string(),
                from: usage.clone(),
                to: usage,
            });
        }
        // New ids: a free slot of the Instance, not yet in this request, with the most free.
        for id in ids.iter().filter(|id| !held.contains_key(*id)) {
            let to = DeviceUsage::configuration(id.clone(), node)
                .map_err(|_| AllocationError::InvalidId(id.clone()))?;
            let best = free
                .iter()
                .filter(|(name, slots)| !used.contains(*name) && !slots.is_empty())
                .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
                .map(|(name, _)| *name);
            let Some(name) = best else {
                return Err(too_many);
            };
            used.insert(name);
            let slot = free.get_mut(name).expect("chosen from free").remove(0);
            claims.push(SlotClaim {
                instance: name.to_string(),
                slot: slot.to_string(),
                from: DeviceUsage::Free,
                to,
            });
        }
        answer.push(claims);
    }
    Ok(answer)
}

/// The ids an IL plugin would rather allocate: slots it already holds, then free ones.
pub fn prefer_instance(
    instance: &InstanceSlots,
    node: &str,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    let rank = |id: &String| match instance.usage(id) {
        Some(usage) if usage.is_instance_level() && usage.is_held_by(node) => 0,
        Some(usage) if usage.is_free() => 1,
        _ => 2,
    };
    fill(must_include, available, size, rank)
}

/// The ids a CL plugin would rather allocate to one container: ones that will succeed.
///
/// Unique: ids this node holds first (reusing a slot), at most one per Instance, then
/// placeholders, no more than there are other Instances with a free slot. Not unique: free
/// slots, filling the Instance with the fewest free slots first.
pub fn prefer_configuration(
    instances: &[InstanceSlots],
    node: &str,
    unique: bool,
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<String> {
    if !unique {
        // Fill one Instance before the next (fewest free slots first), keeping whole devices
        // free for requests that need them: seed 000's example takes both slots of one camera.
        let rank = |id: &String| {
            instance_of_slot(instances, id)
                .ok()
                .filter(|i| i.usage(id).is_some_and(DeviceUsage::is_free))
                .map_or((1, usize::MAX, String::new()), |i| {
                    (0, i.free_count(), i.name.clone())
                })
        };
        let mut chosen: Vec<String> = must_include.to_vec();
        let mut rest: Vec<&String> = available.iter().filter(|id| !chosen.contains(id)).collect();
        rest.sort_by_key(|id| (rank(id), natural(id)));
        chosen.extend(
            rest.into_iter()
                .take(size.saturating_sub(chosen.len()))
                .cloned(),
        );
        return chosen;
    }
    let held = held_virtual_devices(instances, node);
    let mut chosen: Vec<String> = must_include.to_vec();
    let mut used: BTreeSet<&str> = chosen
        .iter()
        .filter_map(|id| held.get(id).map(|(instance, _)| *instance))
        .collect();
    let mut ordered: Vec<&String> = available.iter().filter(|id| !chosen.contains(id)).collect();
    ordered.sort_by_key(|id| (!held.contains_key(*id), natural(id)));
    let mut placeholders_left = instances
        .iter()
        .filter(|i| i.free_count() > 0)
        .count()
        .saturating_sub(chosen.iter().filter(|id| !held.contains_key(*id)).count());
    for id in ordered {
        if chosen.len() >= size {
            break;
        }
        match held.get(id) {
            Some((instance, _)) if used.insert(instance) => chosen.push(id.clone()),
            Some(_) => {}
            None if placeholders_left > 0 => {
                placeholders_left -= 1;
                chosen.push(id.clone());
            }
            None => {}
        }
    }
    chosen
}

/// The virtual device ids this node's CL plugin holds: id -> (instance, slot).
pub fn held_virtual_devices<'a>(
    instances: &'a [InstanceSlots],
    node: &str,
) -> BTreeMap<String, (&'a str, &'a str)> {
    let mut held = BTreeMap::new();
    for instance in instances {
        for (slot, usage) in &instance.slots {
            if let Some(DeviceUsage::Configuration { vdev, node: holder }) = usage
                && holder == node
            {
                held.insert(vdev.clone(), (instance.name.as_str(), slot.as_str()));
            }
        }
    }
    held
}

fn slot_devices(instance: &InstanceSlots, healthy: impl Fn(&DeviceUsage) -> bool) -> Vec<Device> {
    let mut devices: Vec<Device> = instance
        .slots
        .iter()
        .map(|(slot, usage)| Device {
            id: slot.clone(),
            healthy: usage.as_ref().is_some_and(&healthy),
        })
        .collect();
    devices.sort_by_key(|d| natural(&d.id));
    devices
}

/// Claims `slot` of `instance` for `to`; `ours` tells a value that already is the claim.
fn claim_slot(
    instance: &InstanceSlots,
    slot: &str,
    to: &DeviceUsage,
    ours: impl Fn(&DeviceUsage) -> bool,
) -> Result<SlotClaim, AllocationError> {
    let usage = match instance.slots.get(slot) {
        None => return Err(AllocationError::Unknown(slot.to_string())),
        Some(None) => return Err(AllocationError::Malformed(slot.to_string())),
        Some(Some(usage)) => usage,
    };
    if !usage.is_free() && !ours(usage) {
        return Err(AllocationError::Taken {
            slot: slot.to_string(),
            holder: holder(usage),
        });
    }
    Ok(SlotClaim {
        instance: instance.name.clone(),
        slot: slot.to_string(),
        from: usage.clone(),
        to: to.clone(),
    })
}

/// Who holds a slot, in words.
fn holder(usage: &DeviceUsage) -> String {
    match usage {
        DeviceUsage::Free => "nobody".into(),
        DeviceUsage::Instance { node } => format!("node {node} (Instance level)"),
        DeviceUsage::Configuration { node, .. } => format!("node {node} (Configuration level)"),
    }
}

fn instance_of_slot<'a>(
    instances: &'a [InstanceSlots],
    slot: &str,
) -> Result<&'a InstanceSlots, AllocationError> {
    instances
        .iter()
        .find(|i| i.slots.contains_key(slot))
        .ok_or_else(|| AllocationError::Unknown(slot.to_string()))
}

/// Placeholder ids: `"0"`, `"1"`, ... skipping the held ones.
fn placeholders<T>(held: &BTreeMap<String, T>) -> impl Iterator<Item = String> + '_ {
    (0u32..)
        .map(|n| n.to_string())
        .filter(|id| !held.contains_key(id))
}

/// How many distinct Instances one container request could get: those of the ids it holds
/// and those with a free slot.
fn distinct_available(
    free: &BTreeMap<&str, Vec<&str>>,
    held: &BTreeMap<String, (&str, &str)>,
    ids: &[String],
) -> usize {
    let mut instances: BTreeSet<&str> = ids
        .iter()
        .filter_map(|id| held.get(id).map(|(instance, _)| *instance))
        .collect();
    instances.extend(
        free.iter()
            .filter(|(_, slots)| !slots.is_empty())
            .map(|(name, _)| *name),
    );
    instances.len()
}

/// Sort key that orders `x-2` before `x-10` and `"2"` before `"10"`.
fn natural(id: &str) -> (String, u64) {
    let digits = id.len() - id.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = id.split_at(id.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0))
}

/// `must_include`, then `available` in `rank` order, `size` in all.
fn fill(
    must_include: &[String],
    available: &[String],
    size: usize,
    rank: impl Fn(&String) -> u8,
) -> Vec<String> {
    let mut chosen: Vec<String> = must_include.to_vec();
    let mut rest: Vec<&String> = available.iter().filter(|id| !chosen.contains(id)).collect();
    rest.sort_by_key(|id| (rank(id), natural(id)));
    for id in rest {
        if chosen.len() >= size {
            break;
        }
        chosen.push(id.clone());
    }
    chosen
}

#[cfg(test)]
mod tests;
