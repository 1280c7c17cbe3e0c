//! The device inventory (`kubectl akri devices`, `akri-inventory`) against what real nodes'
//! agents, the controller and the real scheduler made: each device where it is, and the claim
//! and pod that hold it; a held device that vanishes, still shown with its holders.

use crate::support::{Cluster, eventually};
use akri_inventory::{Row, read, rows, table};

#[tokio::test]
async fn the_inventory_shows_each_device_where_it_is_and_who_holds_it() {
    let c = Cluster::start(2, false).await;
    let config = c.discovery("inventory", &["i0"], 1, true).await;
    c.wait_published(&config, 2).await;
    let pod = c.pod_claiming(&config, 1).await;
    let node = eventually("the pod bound", async || c.bound_node(&pod).await).await;
    let of_config = async || -> Option<Vec<Row>> {
        let snapshot = read(&c.client, &c.namespace).await.ok()?;
        Some(
            (rows(&snapshot).into_iter())
                .filter(|r| r.configuration == config)
                .collect(),
        )
    };
    let found = eventually("the pod in the inventory", async || {
        let found = of_config().await?;
        found.iter().any(|r| !r.pods.is_empty()).then_some(found)
    })
    .await;
    let holder = format!("{}/{pod}", c.namespace);
    assert_eq!(found.len(), 2, "{}", table(&found));
    let mut nodes: Vec<&str> = found
        .iter()
        .flat_map(|r| r.nodes.iter())
        .map(String::as_str)
        .collect();
    nodes.sort();
    let mut expected: Vec<&str> = c.nodes.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(nodes, expected, "one device on each node");
    assert!(found.iter().all(|r| r.state == "ok"), "{}", table(&found));
    let held: Vec<&Row> = found.iter().filter(|r| !r.claims.is_empty()).collect();
    assert_eq!(held.len(), 1, "{}", table(&found));
    assert_eq!(held[0].claims, std::slice::from_ref(&holder));
    assert_eq!(held[0].pods, std::slice::from_ref(&holder));
    assert_eq!(held[0].nodes, std::slice::from_ref(&node));

    // The held device's node no longer finds it (before any kubelet prepared the claim, so
    // its node lets it go): the claim and its pod are still shown, on a device published no
    // more, under the configuration its request asked for.
    let index = c.nodes.iter().position(|n| *n == node).unwrap();
    std::fs::write(&c.availability_files()[index], "OFFLINE").unwrap();
    let gone = eventually("the held device shown as not published", async || {
        let found = of_config().await?;
        (found.into_iter()).find(|r| r.claims == [holder.clone()] && r.state == "not published")
    })
    .await;
    assert_eq!(gone.pods, [holder]);
    assert_eq!(gone.instance, held[0].instance);
}
