//! Which address a camera's credential goes to. A WS-Discovery answer is anyone's word: a peer
//! on the camera LAN can answer first with a real camera's uuid at its own address, and the
//! handler would send that camera's credential (a WS-UsernameToken) to the peer.
//!
//! So a camera is identified by its uuid *and* the address its device service first answered
//! a query at: the first time a uuid's device service answers (with its credential, if the
//! configuration has one), the handler pins the uuid to that address for the rest of its
//! life, and from then on asks only there. The same uuid answering from elsewhere is left
//! out, with a warning naming both addresses; a uuid that answers from two addresses before
//! either is pinned is left out too (the handler cannot tell which is the camera). When a
//! camera's address changes for good (a new DHCP lease), restart the handler (its DaemonSet,
//! or the kubelet-plugin where it is embedded): the pins go with the process.

use crate::probe::{Camera, host_of};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The address each camera's device service first answered at, by uuid.
#[derive(Debug, Default)]
pub struct Pins(BTreeMap<String, IpAddr>);

impl Pins {
    /// Of the cameras that answered (an entry per uuid and address), the one per uuid the
    /// handler may ask, and why the others are left out.
    pub fn choose(&self, cameras: Vec<Camera>) -> (Vec<Camera>, BTreeSet<String>) {
        let mut by_uuid: BTreeMap<String, Vec<(IpAddr, Camera)>> = BTreeMap::new();
        for camera in cameras {
            let Some(address) = camera.service_urls.first().and_then(|u| host_of(u)) else {
                continue;
            };
            by_uuid
                .entry(camera.uuid.clone())
                .or_default()
                .push((address, camera));
        }
        let mut chosen = Vec::new();
        let mut left_out = BTreeSet::new();
        for (uuid, mut answers) in by_uuid {
            match self.0.get(&uuid) {
                Some(pinned) => {
                    for (address, _) in answers.iter().filter(|(a, _)| a != pinned) {
                        left_out.insert(format!(
                            "camera {uuid} answered from {address}, but its credential goes only to {pinned}, where it first answered (restart the handler if the camera moved there)"
                        ));
                    }
                    if let Some((_, camera)) = answers.into_iter().find(|(a, _)| a == pinned) {
                        chosen.push(camera);
                    }
                }
                None if answers.len() > 1 => {
                    let addresses: Vec<String> =
                        answers.iter().map(|(a, _)| a.to_string()).collect();
                    left_out.insert(format!(
                        "camera {uuid} answered from {} at once: none is asked until one is the camera",
                        addresses.join(" and ")
                    ));
                }
                None => chosen.extend(answers.pop().map(|(_, camera)| camera)),
            }
        }
        (chosen, left_out)
    }

    /// `camera`'s device service answered: its uuid is pinned to that address, if it was not.
    pub fn answered(&mut self, camera: &Camera) {
        if let Some(address) = camera.service_urls.first().and_then(|u| host_of(u)) {
            self.0.entry(camera.uuid.clone()).or_insert(address);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(uuid: &str, host: &str) -> Camera {
        Camera {
            uuid: uuid.into(),
            service_urls: vec![format!("http://{host}/onvif/device_service")],
            scopes: Vec::new(),
        }
    }

    #[test]
    fn a_camera_is_asked_only_where_it_first_answered() {
        let mut pins = Pins::default();
        // First seen alone at its address: asked, and pinned once it answers.
        let (chosen, left_out) = pins.choose(vec![at("cam", "10.0.0.11")]);
        assert_eq!(chosen, [at("cam", "10.0.0.11")]);
        assert!(left_out.is_empty());
        pins.answered(&chosen[0]);
        // A peer answering first with its uuid at its own address: not asked, said.
        let (chosen, left_out) = pins.choose(vec![at("cam", "10.0.0.66"), at("cam", "10.0.0.11")]);
        assert_eq!(chosen, [at("cam", "10.0.0.11")]);
        let said: Vec<_> = left_out.into_iter().collect();
        assert_eq!(said.len(), 1);
        assert!(
            said[0].contains("answered from 10.0.0.66") && said[0].contains("only to 10.0.0.11"),
            "{said:?}"
        );
        // The peer alone: nothing is asked.
        let (chosen, _) = pins.choose(vec![at("cam", "10.0.0.66")]);
        assert!(chosen.is_empty());
        // A pin is the first answer's: a later one does not move it.
        pins.answered(&at("cam", "10.0.0.66"));
        assert_eq!(pins.choose(vec![at("cam", "10.0.0.66")]).0, []);
    }

    #[test]
    fn a_uuid_from_two_addresses_before_any_pin_is_not_asked() {
        let pins = Pins::default();
        let (chosen, left_out) = pins.choose(vec![
            at("cam", "10.0.0.11"),
            at("cam", "10.0.0.66"),
            at("other", "10.0.0.12"),
        ]);
        assert_eq!(chosen, [at("other", "10.0.0.12")]);
        assert!(
            left_out
                .iter()
                .any(|s| s.contains("10.0.0.11 and 10.0.0.66 at once")),
            "{left_out:?}"
        );
    }
}
