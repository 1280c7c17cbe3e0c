//! The udev handler against this machine's own devices: sysfs as the kernel shows it, loop
//! devices attached and detached for real (root, as CI runs), uevents from the kernel.

use akri_discovery_handler::client::discover;
use akri_discovery_handler::{Served, proto};
use akri_testing::LoopDevice;
use akri_udev::sysfs::Sysfs;
use akri_udev::{Details, Selection, Udev};
use std::collections::HashMap;
use std::time::Duration;

fn selection(rules: &[&str], group_recursive: bool) -> Selection {
    Selection::from_details(Details {
        udev_rules: rules.iter().map(|r| r.to_string()).collect(),
        group_recursive,
        permissions: "rwm".into(),
    })
    .unwrap()
}

fn properties(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn spec(node: &str) -> proto::DeviceSpec {
    proto::DeviceSpec {
        container_path: node.into(),
        host_path: node.into(),
        permissions: "rwm".into(),
    }
}

fn kernel_name(device: &str) -> &str {
    LoopDevice::kernel_name(device)
}

#[test]
fn null_is_found_with_the_properties_akris_handler_reports() {
    let found = selection(&[r#"KERNEL=="null""#], false).find(&Sysfs::default());
    assert_eq!(
        found,
        [proto::Device {
            id: "/devices/virtual/mem/null".into(),
            properties: properties(&[
                ("UDEV_DEVPATH", "/devices/virtual/mem/null"),
                ("UDEV_DEVNODE", "/dev/null"),
            ]),
            mounts: vec![],
            device_specs: vec![spec("/dev/null")],
        }]
    );
    // Several rules: a device matching any is found, once.
    let found = selection(
        &[
            r#"KERNEL=="null""#,
            r#"SUBSYSTEM=="mem", KERNEL=="zero|null""#,
        ],
        false,
    )
    .find(&Sysfs::default());
    let ids: Vec<&str> = found.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        ["/devices/virtual/mem/null", "/devices/virtual/mem/zero"]
    );
    // Attributes and their negation.
    let found =
        selection(&[r#"SUBSYSTEM=="mem", ATTR{dev}=="1:3""#], false).find(&Sysfs::default());
    assert_eq!(found[0].id, "/devices/virtual/mem/null");
    let found = selection(
        &[r#"SUBSYSTEM=="mem", KERNEL=="null|zero", ATTR{dev}!="1:3""#],
        false,
    )
    .find(&Sysfs::default());
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, "/devices/virtual/mem/zero");
}

#[test]
fn a_partition_is_found_by_its_parents_attributes_and_grouped_with_it() {
    let mut disk = LoopDevice::new();
    let device = disk.attach();
    let name = kernel_name(&device).to_string();
    let devpath = format!("/devices/virtual/block/{name}");
    let partition = format!("{devpath}/{name}p1");
    let sysfs = Sysfs::default();
    // The partition has no loop/backing_file of its own: ATTRS finds it on its parent.
    let by_parent = format!(
        r#"KERNEL=="{name}p*", ATTRS{{loop/backing_file}}=="{}""#,
        disk.image().display()
    );
    let found = selection(&[&by_parent], false).find(&sysfs);
    assert_eq!(
        found,
        [proto::Device {
            id: partition.clone(),
            properties: properties(&[
                ("UDEV_DEVPATH", &partition),
                ("UDEV_DEVNODE", &format!("{device}p1")),
            ]),
            mounts: vec![],
            device_specs: vec![spec(&format!("{device}p1"))],
        }]
    );
    // The parent keys hold on one device: KERNELS and ATTRS both on loopN, yes; KERNELS on
    // the partition itself and ATTRS on its parent, no.
    let same_parent = format!(
        r#"KERNEL=="{name}p1", KERNELS=="{name}", ATTRS{{loop/backing_file}}=="{}""#,
        disk.image().display()
    );
    assert_eq!(selection(&[&same_parent], false).find(&sysfs).len(), 1);
    let split = format!(
        r#"KERNEL=="{name}p1", KERNELS=="{name}p1", ATTRS{{loop/backing_file}}=="{}""#,
        disk.image().display()
    );
    assert!(selection(&[&split], false).find(&sysfs).is_empty());
    // A `!=` parent key: no device up the chain matches.
    let not_below_it = format!(r#"KERNEL=="{name}p1", KERNELS!="{name}""#);
    assert!(selection(&[&not_below_it], false).find(&sysfs).is_empty());

    // Without grouping, the disk and its partition are two devices; with it, one.
    let rules = [disk.udev_rule(), by_parent.clone()];
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    let apart = selection(&rules, false).find(&sysfs);
    let ids: Vec<&str> = apart.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, [devpath.as_str(), partition.as_str()]);
    let grouped = selection(&rules, true).find(&sysfs);
    assert_eq!(
        grouped,
        [proto::Device {
            id: devpath.clone(),
            properties: properties(&[
                ("UDEV_DEVPATH", &devpath),
                ("UDEV_DEVNODE_0", &device),
                ("UDEV_DEVNODE_1", &format!("{device}p1")),
            ]),
            mounts: vec![],
            device_specs: vec![spec(&device), spec(&format!("{device}p1"))],
        }]
    );
    disk.detach();
    // `losetup -d` of a device something still has open (a partition scan) only marks it to
    // be cleared at the last close: it leaves sysfs a moment later.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !selection(&rules, true).find(&sysfs).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the detached disk is still found after 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

async fn next_ids(stream: &mut tonic::Streaming<proto::DiscoverResponse>) -> Vec<String> {
    let response = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a device list within 10 s")
        .expect("the stream carries on")
        .expect("the stream is open");
    response.devices.into_iter().map(|d| d.id).collect()
}

#[tokio::test]
async fn a_loop_device_attached_and_detached_is_added_and_removed_by_uevents() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("udev.sock");
    let mut udev = Udev::start();
    assert!(udev.monitor.live(), "uevents are readable here");
    // No rescans during the test: only the kernel's events can show the changes.
    udev.rescan = Duration::from_secs(3600);
    let _served = Served::start(udev, &socket).unwrap();
    let mut disk = LoopDevice::new();
    let details = format!("udevRules:\n- '{}'\n", disk.udev_rule());
    let mut stream = discover(&socket, &details, &[]).await.unwrap();
    assert!(
        next_ids(&mut stream).await.is_empty(),
        "nothing attached yet"
    );

    let device = disk.attach();
    let devpath = format!("/devices/virtual/block/{}", kernel_name(&device));
    assert_eq!(next_ids(&mut stream).await, [devpath]);
    disk.detach();
    assert!(next_ids(&mut stream).await.is_empty(), "detached");
}

#[tokio::test]
async fn bad_details_fail_the_call_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("udev.sock");
    let _served = Served::start(Udev::start(), &socket).unwrap();
    for (details, says) in [
        ("udevRules: []", "udevRules is empty"),
        ("udevRule: ['KERNEL==\"null\"']", "udevRule"),
        ("udevRules: ['KERNEL=\"null\"']", "assigns a value"),
        ("udevRules: ['NAME==\"x\"']", "NAME is not supported"),
        (
            "udevRules: ['KERNEL==\"null\"']\npermissions: rwx",
            "permissions \"rwx\"",
        ),
        ("{{{", "udev discovery details"),
    ] {
        let status = discover(&socket, details, &[]).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{details}");
        assert!(
            status.message().starts_with("udev discovery details: ")
                && status.message().contains(says),
            "{details}: {}",
            status.message()
        );
    }
    // The handler still serves good details afterwards.
    let mut stream = discover(&socket, "udevRules: ['KERNEL==\"null\"']", &[])
        .await
        .unwrap();
    assert_eq!(next_ids(&mut stream).await, ["/devices/virtual/mem/null"]);
}
