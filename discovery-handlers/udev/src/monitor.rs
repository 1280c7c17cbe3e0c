//! Hot-plug: the kernel's uevents (and udevd's, where it runs and the handler shares the
//! host's network namespace) over netlink. Every discovery rescans on an event; where the
//! socket cannot be opened, discoveries rescan on a timer instead.

use netlink_sys::protocols::NETLINK_KOBJECT_UEVENT;
use netlink_sys::{AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket};
use tokio::sync::watch;

/// The kernel's uevent multicast group and udevd's.
const KERNEL_GROUP: u32 = 1;
const UDEV_GROUP: u32 = 2;

/// Device events, counted: a discovery waits for the count to change.
#[derive(Clone, Debug)]
pub struct Monitor {
    events: Option<watch::Receiver<u64>>,
}

impl Monitor {
    /// Listens for uevents on a task of its own. Needs a Tokio runtime.
    pub fn start() -> Monitor {
        match listen() {
            Ok(socket) => {
                let (tx, rx) = watch::channel(0);
                tokio::spawn(forward(socket, tx));
                Monitor { events: Some(rx) }
            }
            Err(error) => {
                tracing::warn!(%error, "no uevents (netlink): devices are found by rescanning only");
                Monitor::none()
            }
        }
    }

    /// No events: rescans only.
    pub fn none() -> Monitor {
        Monitor { events: None }
    }

    /// Whether events arrive.
    pub fn live(&self) -> bool {
        self.events.is_some()
    }

    /// The events from now on.
    pub fn subscribe(&self) -> Option<watch::Receiver<u64>> {
        self.events.clone().map(|mut rx| {
            rx.mark_unchanged();
            rx
        })
    }
}

fn listen() -> std::io::Result<TokioSocket> {
    let mut socket = TokioSocket::new(NETLINK_KOBJECT_UEVENT)?;
    socket
        .socket_mut()
        .bind(&SocketAddr::new(0, KERNEL_GROUP | UDEV_GROUP))?;
    Ok(socket)
}

async fn forward(socket: TokioSocket, tx: watch::Sender<u64>) {
    let mut buffer = bytes::BytesMut::with_capacity(64 * 1024);
    loop {
        buffer.clear();
        match socket.recv_from(&mut buffer).await {
            Ok(_) => {
                tracing::trace!(event = %String::from_utf8_lossy(&buffer[..buffer.len().min(120)]), "uevent");
                tx.send_modify(|count| *count += 1);
            }
            Err(error) => {
                // ENOBUFS: events were dropped; a rescan catches up on whatever they were.
                tracing::debug!(%error, "reading uevents");
                tx.send_modify(|count| *count += 1);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}
