//! A loopback TCP proxy a test can stall: a network partition between one client and its
//! server, without touching either; and a Unix socket relay that can stop passing bytes (a
//! wedged or slow process behind a socket). TLS passes through untouched (the proxy never looks at
//! the bytes), so a client that trusts the server trusts it through the proxy too.

use crate::Error;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Forwards connections on a loopback port to `upstream` until dropped.
pub struct TcpProxy {
    address: SocketAddr,
    stalled: watch::Sender<bool>,
    /// While true the upstream is "down": connections are closed and new ones refused.
    down: watch::Sender<bool>,
    /// Connections numbered below this are black-holed: open, and silent forever.
    frozen_below: watch::Sender<u64>,
    /// Connections numbered below this are closed.
    closed_below: watch::Sender<u64>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Connections whose bytes it still moves.
    open: watch::Sender<usize>,
    accept: tokio::task::JoinHandle<()>,
}

/// Counts one open connection until dropped.
struct Open(watch::Sender<usize>);

impl Open {
    fn new(open: &watch::Sender<usize>) -> Open {
        open.send_modify(|n| *n += 1);
        Open(open.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl TcpProxy {
    /// Listens on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> Result<TcpProxy, Error> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(Error::io("bind the proxy"))?;
        let address = listener
            .local_addr()
            .map_err(Error::io("read the proxy's address"))?;
        let (stalled, _) = watch::channel(false);
        let (down, _) = watch::channel(false);
        let (frozen_below, _) = watch::channel(0);
        let (closed_below, _) = watch::channel(0);
        let (open, _) = watch::channel(0);
        let opened = open.clone();
        let closer = closed_below.clone();
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let gate = stalled.clone();
        let outage = down.clone();
        let freezer = frozen_below.clone();
        let counter = accepted.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let id = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if *outage.borrow() {
                    // As close to "connection refused" as an open port gets: closed at once.
                    drop(client);
                    continue;
                }
                let gate = Gate {
                    stalled: gate.subscribe(),
                    frozen_below: freezer.subscribe(),
                    id,
                };
                let mut outage = outage.subscribe();
                let mut closed = closer.subscribe();
                let counted = Open::new(&opened);
                tokio::spawn(async move {
                    let _counted = counted;
                    // A connection made while stalled waits like the others.
                    gate.clone().open().await;
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::select! {
                        _ = async {
                            tokio::join!(
                                forward(client_read, server_write, gate.clone()),
                                forward(server_read, client_write, gate),
                            )
                        } => {}
                        // Going down closes every connection (the halves drop here).
                        _ = outage.wait_for(|down| *down) => {}
                        _ = closed.wait_for(|below| *below > id) => {}
                    }
                });
            }
        });
        Ok(TcpProxy {
            address,
            stalled,
            down,
            frozen_below,
            closed_below,
            accepted,
            open,
            accept,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops moving bytes in both directions: connections stay open, requests and responses
    /// wait (as on a partitioned network), new connections are accepted but go nowhere.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Moves the bytes that waited, and everything after; ends an outage.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
        self.down.send_replace(false);
    }

    /// Every connection open now goes silent for good (a peer that died without closing, a
    /// NAT entry that expired): bytes are neither moved nor refused. Connections made later
    /// work. Only a client with its own deadlines notices and reconnects.
    pub fn black_hole_open_connections(&self) {
        let now = self.accepted.load(std::sync::atomic::Ordering::SeqCst);
        self.frozen_below.send_replace(now);
    }

    /// Closes every connection open now (as a restarted load balancer would); new ones work.
    /// Clients must connect again, and so meet whatever changed meanwhile (e.g. their RBAC).
    pub fn close_open_connections(&self) {
        let now = self.accepted.load(std::sync::atomic::Ordering::SeqCst);
        self.closed_below.send_replace(now);
    }

    /// The upstream goes away (an API server outage): every connection is closed and new
    /// ones are closed as soon as they are accepted, until [`resume`](Self::resume).
    pub fn go_down(&self) {
        self.down.send_replace(true);
    }

    /// Waits until no connection is open through the proxy: each one's client closed it and
    /// the upstream answered what it had sent (or closed it too). After a client is dropped,
    /// the event that proves the API server has seen the last of its requests.
    pub async fn all_closed(&self) {
        let _ = self.open.subscribe().wait_for(|n| *n == 0).await;
    }

    /// A copy of `config` whose requests go through this proxy (same credentials; the
    /// proxy listens on 127.0.0.1, which the test API server's certificate names).
    pub fn client_config(&self, config: &kube::Config) -> Result<kube::Config, Error> {
        let mut config = config.clone();
        config.cluster_url = format!("https://{}", self.address)
            .parse()
            .map_err(|e| Error::Other(format!("proxy URL: {e}")))?;
        Ok(config)
    }
}

/// When a connection may move bytes.
#[derive(Clone)]
struct Gate {
    stalled: watch::Receiver<bool>,
    frozen_below: watch::Receiver<u64>,
    id: u64,
}

impl Gate {
    async fn open(&mut self) {
        let _ = self.stalled.wait_for(|stalled| !stalled).await;
        if *self.frozen_below.borrow() > self.id {
            std::future::pending::<()>().await;
        }
    }
}

async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: Gate,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        gate.open().await;
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Bytes read just before a stall wait for the end of it.
        gate.open().await;
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A Unix socket relay to a handler that can stop passing bytes, in both directions and on
/// every connection, as the socket of a stopped (SIGSTOP) or wedged process does: connecting
/// still works, nothing is answered, not even HTTP/2 pings.
pub struct UnixRelay {
    /// Where clients connect.
    pub socket: std::path::PathBuf,
    open: tokio::sync::watch::Sender<bool>,
    _task: tokio::task::JoinHandle<()>,
}

impl UnixRelay {
    /// Relays connections on `socket` to `upstream`, connecting to it anew for each one (so
    /// a restarted upstream is reached again).
    pub fn start(socket: std::path::PathBuf, upstream: std::path::PathBuf) -> UnixRelay {
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let (open, _) = tokio::sync::watch::channel(true);
        let passing = open.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::UnixStream::connect(&upstream).await else {
                    continue;
                };
                let ((client_read, client_write), (server_read, server_write)) =
                    (client.into_split(), server.into_split());
                tokio::spawn(Self::pump(client_read, server_write, passing.subscribe()));
                tokio::spawn(Self::pump(server_read, client_write, passing.subscribe()));
            }
        });
        UnixRelay {
            socket,
            open,
            _task: task,
        }
    }

    /// Stops (`false`) or resumes passing bytes.
    pub fn pass(&self, open: bool) {
        self.open.send_replace(open);
    }

    async fn pump(
        mut from: tokio::net::unix::OwnedReadHalf,
        mut to: tokio::net::unix::OwnedWriteHalf,
        mut open: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            if open.wait_for(|open| *open).await.is_err() {
                return;
            }
            // Reading is cancel-safe: a read given up when the relay stops loses nothing.
            let read = tokio::select! {
                read = from.read(&mut buffer) => read,
                _ = open.wait_for(|open| !*open) => continue,
            };
            let n = match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if open.wait_for(|open| *open).await.is_err()
                || to.write_all(&buffer[..n]).await.is_err()
            {
                return;
            }
        }
    }
}
