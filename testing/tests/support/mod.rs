//! Test-only helpers: a trivial DRA kubelet plugin and polling.

#![allow(dead_code)]

use akri_testing::KubeletPeer;
use dra_plugin::registration::{PluginInfo, Registration, RegistrationStatus};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use kubelet_proto::dra::v1 as dra;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Polls `check` every 200 ms until it returns `Some`, or fails after `timeout`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if start.elapsed() > timeout {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The CDI kind the test plugin uses for a driver.
pub fn cdi_kind(driver: &str) -> String {
    format!("{driver}/device")
}

#[derive(Default)]
struct State {
    registration: Option<Registration>,
    unprepared: Vec<String>,
}

/// A DRA driver in a few lines: answers NodePrepareResources with one CDI id per allocated
/// device (reading the allocation from the API server) and writes a CDI spec for it.
#[derive(Clone)]
pub struct TestDraPlugin {
    driver: String,
    client: kube::Client,
    cdi_dir: PathBuf,
    state: Arc<Mutex<State>>,
}

impl TestDraPlugin {
    /// Serves the DRA service in the peer's plugins dir and registers it through the peer's
    /// registry dir.
    pub async fn start(
        peer: &KubeletPeer,
        driver: &str,
        client: kube::Client,
    ) -> std::io::Result<Self> {
        let plugin = TestDraPlugin {
            driver: driver.to_string(),
            client,
            cdi_dir: peer.cdi_dir(),
            state: Arc::default(),
        };
        let service_dir = peer.plugins_dir().join(driver);
        std::fs::create_dir_all(&service_dir)?;
        let service_socket = service_dir.join("dra.sock");
        let service = tokio::net::UnixListener::bind(&service_socket)?;
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(dra::dra_plugin_server::DraPluginServer::new(plugin.clone()))
                .serve_with_incoming(UnixListenerStream::new(service)),
        );
        let registration = Registration::serve(
            &peer.registry_dir(),
            PluginInfo {
                driver_name: driver.to_string(),
                endpoint: service_socket,
                supported_versions: vec![dra::SUPPORTED_VERSION.into()],
            },
        )
        .map_err(std::io::Error::other)?;
        plugin.state.lock().unwrap().registration = Some(registration);
        Ok(plugin)
    }

    pub fn registration_status(&self) -> Option<RegistrationStatus> {
        self.state
            .lock()
            .unwrap()
            .registration
            .as_ref()
            .map(Registration::status)
    }

    pub fn unprepared(&self) -> Vec<String> {
        self.state.lock().unwrap().unprepared.clone()
    }

    async fn prepare_claim(&self, claim: &dra::Claim) -> Result<Vec<dra::Device>, String> {
        let claims = Api::<ResourceClaim>::namespaced(self.client.clone(), &claim.namespace);
        let object = claims.get(&claim.name).await.map_err(|e| e.to_string())?;
        if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Err(format!("claim {} has another UID now", claim.name));
        }
        let results = object
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default();
        let mut devices = Vec::new();
        let mut cdi_devices = Vec::new();
        for result in results.into_iter().filter(|r| r.driver == self.driver) {
            cdi_devices.push(serde_json::json!({
                "name": result.device,
                "containerEdits": { "env": [format!("AKRI_TEST_DEVICE={}", result.device)] },
            }));
            devices.push(dra::Device {
                request_names: vec![result.request.clone()],
                pool_name: result.pool.clone(),
                device_name: result.device.clone(),
                cdi_device_ids: vec![format!("{}={}", cdi_kind(&self.driver), result.device)],
                share_id: None,
            });
        }
        let spec = serde_json::json!({
            "cdiVersion": "0.6.0",
            "kind": cdi_kind(&self.driver),
            "devices": cdi_devices,
        });
        std::fs::write(
            self.cdi_dir
                .join(format!("{}-{}.json", self.driver, claim.uid)),
            spec.to_string(),
        )
        .map_err(|e| e.to_string())?;
        Ok(devices)
    }
}

#[tonic::async_trait]
impl dra::dra_plugin_server::DraPlugin for TestDraPlugin {
    async fn node_prepare_resources(
        &self,
        request: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let answer = match self.prepare_claim(&claim).await {
                Ok(devices) => dra::NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(error) => dra::NodePrepareResourceResponse {
                    devices: vec![],
                    error,
                },
            };
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(dra::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let mut claims = std::collections::HashMap::new();
        for claim in request.into_inner().claims {
            let _ = std::fs::remove_file(
                self.cdi_dir
                    .join(format!("{}-{}.json", self.driver, claim.uid)),
            );
            self.state
                .lock()
                .unwrap()
                .unprepared
                .push(claim.uid.clone());
            claims.insert(claim.uid, dra::NodeUnprepareResourceResponse::default());
        }
        Ok(Response::new(dra::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}
