//! The node's address: the kubelet refuses a loopback or link-local node IP, and the API
//! server must reach the kubelet at it (for logs). Each node gets a bridge of its own, which
//! CNI then also uses for its pods, carrying one address from 198.18.0.0/15 (RFC 2544's
//! benchmarking range: never routed, so no host's network can clash with it), picked from the
//! test process's pid and the node's number. Two nodes holding the same address on different
//! interfaces would still work: each kubelet binds its own port.

use crate::Error;
use std::net::Ipv4Addr;

/// Creates bridge `name`, up, with `address`.
pub(super) fn create_bridge(name: &str, address: Ipv4Addr) -> Result<(), Error> {
    ip(&["link", "add", name, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{address}/32"), "dev", name])?;
    ip(&["link", "set", name, "up"])
}

/// The address of node number `n` of process `pid`.
pub(super) fn node_address(pid: u32, n: u32) -> Ipv4Addr {
    // 2^17 addresses; skip .0 and .255 of each /24 so none looks like a network or broadcast.
    let index = (pid.wrapping_mul(16).wrapping_add(n)) % (512 * 254);
    let (block, host) = (index / 254, index % 254 + 1);
    Ipv4Addr::new(
        198,
        18 + (block / 256) as u8,
        (block % 256) as u8,
        host as u8,
    )
}

fn ip(args: &[&str]) -> Result<(), Error> {
    super::run("ip", args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_in_the_benchmark_range_and_differ_per_node() {
        for pid in [1, 4_194_304, 123_457] {
            for n in 0..16 {
                let a = node_address(pid, n);
                let o = a.octets();
                assert!(o[0] == 198 && (o[1] == 18 || o[1] == 19), "{a}");
                assert!(o[3] != 0 && o[3] != 255, "{a}");
            }
        }
        assert_ne!(node_address(7, 0), node_address(7, 1));
        assert_ne!(node_address(7, 0), node_address(8, 0));
    }
}
