//! Seed 003's allocation examples and seed 000's advertisement rules, as pure functions.

use super::*;

const A: &str = "akri-onvif-8120fe";
const B: &str = "akri-onvif-a19705";

/// Two cameras of capacity 2; `held` sets slots (`(slot, value)`), the rest are free.
fn cameras(held: &[(&str, &str)]) -> Vec<InstanceSlots> {
    [A, B]
        .iter()
        .map(|name| InstanceSlots {
            name: name.to_string(),
            slots: (0..2)
                .map(|i| {
                    let slot = format!("{name}-{i}");
                    let value = held
                        .iter()
                        .find(|(s, _)| *s == slot)
                        .map_or("", |(_, v)| *v);
                    (slot, Some(value.parse().unwrap()))
                })
                .collect(),
        })
        .collect()
}

fn ids(devices: &[Device]) -> Vec<(&str, bool)> {
    devices.iter().map(|d| (d.id.as_str(), d.healthy)).collect()
}

fn request(containers: &[&[&str]]) -> Vec<Vec<String>> {
    containers
        .iter()
        .map(|ids| ids.iter().map(|s| s.to_string()).collect())
        .collect()
}

/// (slot, value written) per container.
fn slots(claims: &[Vec<SlotClaim>]) -> Vec<Vec<(String, String)>> {
    claims
        .iter()
        .map(|c| {
            c.iter()
                .map(|c| (c.slot.clone(), c.to.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn seed_003_advertises_held_ids_plus_one_per_camera_with_a_free_slot() {
    // All four slots free: two placeholders although four slots are free.
    assert_eq!(
        ids(&configuration_devices(&cameras(&[]), "node-a", true)),
        [("0", true), ("1", true)]
    );
    // 8120fe-1 held as virtual device "4": "0", "1" and "4".
    let instances = cameras(&[("akri-onvif-8120fe-1", "C:4:node-a")]);
    assert_eq!(
        ids(&configuration_devices(&instances, "node-a", true)),
        [("0", true), ("1", true), ("4", true)]
    );
    // Another node sees only the placeholders: its ids are its own.
    assert_eq!(
        ids(&configuration_devices(&instances, "node-b", true)),
        [("0", true), ("1", true)]
    );
    // All four held: all four advertised, no placeholder.
    let all = cameras(&[
        ("akri-onvif-8120fe-0", "C:0:node-a"),
        ("akri-onvif-8120fe-1", "C:1:node-a"),
        ("akri-onvif-a19705-0", "C:2:node-a"),
        ("akri-onvif-a19705-1", "C:3:node-a"),
    ]);
    assert_eq!(
        ids(&configuration_devices(&all, "node-a", true)),
        [("0", true), ("1", true), ("2", true), ("3", true)]
    );
}

#[test]
fn seed_003_allocation_examples() {
    // "3": a19705-1 is the only slot used; "0", "1", "3" are advertised.
    let instances = cameras(&[("akri-onvif-a19705-1", "C:3:node-a")]);

    // "0" and "3" in one container: "0" goes to 8120fe (most free slots), "3" keeps a19705-1.
    let claims = allocate_configuration(&instances, "node-a", true, &request(&[&["0", "3"]]));
    assert_eq!(
        slots(&claims.unwrap()),
        [vec![
            ("akri-onvif-a19705-1".into(), "C:3:node-a".into()),
            ("akri-onvif-8120fe-0".into(), "C:0:node-a".into()),
        ]]
    );

    // "0", "1" and "3" in one container: only two cameras exist.
    assert_eq!(
        allocate_configuration(&instances, "node-a", true, &request(&[&["0", "1", "3"]])),
        Err(AllocationError::NotEnoughDevices {
            requested: 3,
            available: 2
        })
    );

    // "0" and "1" in one container, "3" in another.
    let claims =
        allocate_configuration(&instances, "node-a", true, &request(&[&["0", "1"], &["3"]]));
    assert_eq!(
        slots(&claims.unwrap()),
        [
            vec![
                ("akri-onvif-8120fe-0".into(), "C:0:node-a".into()),
                ("akri-onvif-a19705-0".into(), "C:1:node-a".into()),
            ],
            vec![("akri-onvif-a19705-1".into(), "C:3:node-a".into())],
        ]
    );

    // All four slots held by the CL plugin: "0" and "1" map to one camera and are refused.
    let all = cameras(&[
        ("akri-onvif-8120fe-0", "C:0:node-a"),
        ("akri-onvif-8120fe-1", "C:1:node-a"),
        ("akri-onvif-a19705-0", "C:2:node-a"),
        ("akri-onvif-a19705-1", "C:3:node-a"),
    ]);
    assert!(matches!(
        allocate_configuration(&all, "node-a", true, &request(&[&["0", "1"]])),
        Err(AllocationError::NotEnoughDevices { .. })
    ));
    // ... while "0" and "2" are two cameras, and reuse their slots without writing.
    let claims = allocate_configuration(&all, "node-a", true, &request(&[&["0", "2"]])).unwrap();
    assert!(claims[0].iter().all(|c| !c.writes()));
}

#[test]
fn unique_preference_steers_the_kubelet_to_ids_that_succeed() {
    // Held "0" (8120fe) and "1" (8120fe): both one camera; with placeholder "2" for a19705.
    let instances = cameras(&[
        ("akri-onvif-8120fe-0", "C:0:node-a"),
        ("akri-onvif-8120fe-1", "C:1:node-a"),
    ]);
    let available = request(&[&["0", "1", "2"]]).remove(0);
    let preferred = prefer_configuration(&instances, "node-a", true, &available, &[], 2);
    assert_eq!(preferred, ["0", "2"]);
    let claims =
        allocate_configuration(&instances, "node-a", true, &[preferred]).expect("succeeds");
    assert_eq!(claims[0].len(), 2);
}

#[test]
fn seed_000_instance_level_health() {
    // node-a's CL plugin holds 8120fe-0, node-b's IL plugin holds a19705-0, node-a's IL
    // plugin holds a19705-1.
    let instances = cameras(&[
        ("akri-onvif-8120fe-0", "C:0:node-a"),
        ("akri-onvif-a19705-0", "node-b"),
        ("akri-onvif-a19705-1", "node-a"),
    ]);
    assert_eq!(
        ids(&instance_devices(&instances[0], "node-a")),
        [
            ("akri-onvif-8120fe-0", false),
            ("akri-onvif-8120fe-1", true)
        ],
        "reserved by the CL plugin: unhealthy for the IL plugin"
    );
    assert_eq!(
        ids(&instance_devices(&instances[1], "node-a")),
        [
            ("akri-onvif-a19705-0", false),
            ("akri-onvif-a19705-1", true)
        ],
        "held by another node: unhealthy; held by self: healthy"
    );
    assert_eq!(
        ids(&instance_devices(&instances[1], "node-b")),
        [
            ("akri-onvif-a19705-0", true),
            ("akri-onvif-a19705-1", false)
        ]
    );
}

#[test]
fn seed_000_not_unique_offers_every_slot() {
    let instances = cameras(&[
        ("akri-onvif-8120fe-0", "C:akri-onvif-8120fe-0:node-a"),
        ("akri-onvif-8120fe-1", "C:akri-onvif-8120fe-1:node-a"),
    ]);
    assert_eq!(
        ids(&configuration_devices(&instances, "node-a", false)),
        [
            ("akri-onvif-8120fe-0", true),
            ("akri-onvif-8120fe-1", true),
            ("akri-onvif-a19705-0", true),
            ("akri-onvif-a19705-1", true),
        ]
    );
    assert_eq!(
        ids(&configuration_devices(&instances, "node-b", false)),
        [
            ("akri-onvif-8120fe-0", false),
            ("akri-onvif-8120fe-1", false),
            ("akri-onvif-a19705-0", true),
            ("akri-onvif-a19705-1", true),
        ]
    );
    // Two slots of one camera in one container are allowed when devices need not be unique.
    let free = cameras(&[]);
    let claims = allocate_configuration(
        &free,
        "node-a",
        false,
        &request(&[&["akri-onvif-8120fe-0", "akri-onvif-8120fe-1"]]),
    )
    .unwrap();
    assert_eq!(
        slots(&claims),
        [vec![
            (
                "akri-onvif-8120fe-0".into(),
                "C:akri-onvif-8120fe-0:node-a".into()
            ),
            (
                "akri-onvif-8120fe-1".into(),
                "C:akri-onvif-8120fe-1:node-a".into()
            ),
        ]]
    );
    // The preference fills one camera first, as seed 000's example does.
    let available = request(&[&[
        "akri-onvif-8120fe-0",
        "akri-onvif-8120fe-1",
        "akri-onvif-a19705-0",
        "akri-onvif-a19705-1",
    ]])
    .remove(0);
    assert_eq!(
        prefer_configuration(&free, "node-a", false, &available, &[], 2),
        ["akri-onvif-8120fe-0", "akri-onvif-8120fe-1"]
    );
}

#[test]
fn taken_and_malformed_slots_are_refused() {
    let mut instances = cameras(&[("akri-onvif-8120fe-0", "node-b")]);
    instances[0]
        .slots
        .insert("akri-onvif-8120fe-1".into(), None);
    let ids = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        allocate_instance(&instances[0], "node-a", &ids(&["akri-onvif-8120fe-0"])),
        Err(AllocationError::Taken {
            slot: "akri-onvif-8120fe-0".into(),
            holder: "node node-b (Instance level)".into()
        })
    );
    assert_eq!(
        allocate_instance(&instances[0], "node-a", &ids(&["akri-onvif-8120fe-1"])),
        Err(AllocationError::Malformed("akri-onvif-8120fe-1".into()))
    );
    assert_eq!(
        allocate_instance(&instances[0], "node-a", &ids(&["akri-onvif-8120fe-7"])),
        Err(AllocationError::Unknown("akri-onvif-8120fe-7".into()))
    );
    // Held by this node already (a kubelet allocating again): no write.
    let claims = allocate_instance(&instances[0], "node-b", &ids(&["akri-onvif-8120fe-0"]));
    assert!(!claims.unwrap()[0].writes());
    // The same id twice in one call.
    assert_eq!(
        allocate_configuration(&instances, "node-a", true, &request(&[&["0"], &["0"]])),
        Err(AllocationError::Duplicate("0".into()))
    );
}
