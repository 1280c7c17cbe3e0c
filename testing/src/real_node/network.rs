//! The node's network: the kubelet refuses a loopback or link-local node IP, and the API
//! server must reach the kubelet at it (for logs). Each node gets a bridge of its own and a
//! /26 of 198.18.0.0/15 (RFC 2544's benchmarking range: never routed, so no host's network can
//! clash with it), picked from the test process's pid and the node's number. The block's first
//! address is the node's, on the bridge, and the rest are its pods' (CNI's bridge plugin with
//! that address as their gateway: it insists on being the bridge's only IPv4 address, so node
//! and gateway are one). Through it pods reach this machine, where the `kubernetes` Service
//! leads ([`crate::services`]), and nothing beyond it: [`confine_pods`] drops whatever a pod
//! sends that this machine would forward elsewhere (the bridge plugin turns forwarding on for
//! a gateway).

use crate::Error;
use std::net::Ipv4Addr;

/// Creates bridge `name`, up, with `network`'s address.
pub(crate) fn create_bridge(name: &str, network: &NodeNetwork) -> Result<(), Error> {
    ip(&["link", "add", name, "type", "bridge"])?;
    ip(&["addr", "add", &network.address_with_prefix(), "dev", name])?;
    ip(&["link", "set", name, "up"])
}

/// The node number whose network is the API server's when pods reach it: never a node's.
pub(super) const API_SERVER_SLOT: u32 = 15;

/// A node's block of addresses: its own (the pods' gateway) and its pods' subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NodeNetwork {
    /// The block's first address.
    pub address: Ipv4Addr,
    base: u32,
}

impl NodeNetwork {
    const PREFIX: u32 = 26;
    /// /26 blocks in 198.18.0.0/15.
    const BLOCKS: u32 = 1 << (Self::PREFIX - 15);

    /// The block of node number `n` of process `pid`.
    pub fn of(pid: u32, n: u32) -> Self {
        let index = pid.wrapping_mul(16).wrapping_add(n) % Self::BLOCKS;
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + (index << (32 - Self::PREFIX));
        NodeNetwork {
            address: Ipv4Addr::from(base + 1),
            base,
        }
    }

    /// The pods' subnet (CNI host-local's `subnet`; its gateway is [`address`](Self::address)).
    pub fn subnet(&self) -> String {
        format!("{}/{}", Ipv4Addr::from(self.base), Self::PREFIX)
    }

    fn address_with_prefix(&self) -> String {
        format!("{}/{}", self.address, Self::PREFIX)
    }
}

/// Makes sure no packet from a node's pods leaves this machine: a table of its own (made once,
/// kept) whose forward hook drops what arrives on a test bridge for anywhere but a test bridge.
pub(super) fn confine_pods() -> Result<(), Error> {
    const RULES: &str = "table inet akri-test-pods {
  chain forward {
    type filter hook forward priority filter; policy accept;
    iifname \"akn*\" oifname != \"akn*\" drop
  }
}
";
    let output = std::process::Command::new("nft")
        .args(["list", "table", "inet", "akri-test-pods"])
        .output()
        .map_err(Error::io("run nft"))?;
    if output.status.success() {
        return Ok(());
    }
    let file = std::env::temp_dir().join(format!("akri-test-pods-{}.nft", std::process::id()));
    std::fs::write(&file, RULES).map_err(Error::io("write the pods' nftables rules"))?;
    let result = super::run("nft", &["-f", &file.display().to_string()]);
    let _ = std::fs::remove_file(&file);
    result
}

/// An nftables table of its own refusing one node's pods one port of this machine; removed
/// when dropped (one a killed test left behind matches a bridge that is gone).
pub struct Refusal {
    table: String,
}

impl Refusal {
    pub(super) fn create(bridge: &str, port: u16) -> Result<Self, Error> {
        let table = format!("akri-test-refuse-{bridge}-{port}");
        let rules = format!(
            "table inet {table} {{
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname \"{bridge}\" tcp dport {port} reject with tcp reset
  }}
}}
"
        );
        let file = std::env::temp_dir().join(format!("{table}.nft"));
        std::fs::write(&file, rules).map_err(Error::io("write a refusal's nftables rules"))?;
        let result = super::run("nft", &["-f", &file.display().to_string()]);
        let _ = std::fs::remove_file(&file);
        result.map(|()| Refusal { table })
    }
}

impl Drop for Refusal {
    fn drop(&mut self) {
        let _ = super::run("nft", &["delete", "table", "inet", &self.table]);
    }
}

fn ip(args: &[&str]) -> Result<(), Error> {
    super::run("ip", args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_stay_in_the_benchmark_range_and_differ_per_node() {
        for pid in [1, 4_194_304, 123_457] {
            for n in 0..=API_SERVER_SLOT {
                let network = NodeNetwork::of(pid, n);
                let o = network.address.octets();
                assert!(o[0] == 198 && (o[1] == 18 || o[1] == 19), "{network:?}");
                assert_eq!(o[3] % 64, 1, "{network:?}");
            }
        }
        assert_ne!(NodeNetwork::of(7, 0), NodeNetwork::of(7, 1));
        assert_ne!(NodeNetwork::of(7, 0), NodeNetwork::of(8, 0));
        let first = NodeNetwork::of(0, 0);
        assert_eq!(first.subnet(), "198.18.0.0/26");
        assert_eq!(first.address_with_prefix(), "198.18.0.1/26");
        assert_eq!(NodeNetwork::of(0, 1).subnet(), "198.18.0.64/26");
        assert_eq!(NodeNetwork::of(0, 2047).subnet(), "198.19.255.192/26");
    }
}
