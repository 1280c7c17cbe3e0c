//! The kubelet's gRPC protocols, generated at build time from upstream's `.proto` files
//! (`protos/`): what a kubelet plugin written in Rust speaks. Nothing Akri in here.
//!
//! Every package, service name and field number is upstream's, so the peer is the real
//! kubelet. Module paths follow the upstream API paths:
//!
//! | module | upstream | served by |
//! |---|---|---|
//! | [`pluginregistration`] | `k8s.io/kubelet/pkg/apis/pluginregistration/v1` | every kubelet plugin, on its registry socket |
//! | [`dra::v1`], [`dra::v1beta1`] | `k8s.io/kubelet/pkg/apis/dra/{v1,v1beta1}` | a DRA driver, on its service socket |
//! | [`dra::health::v1`], [`dra::health::v1alpha1`] | `k8s.io/kubelet/pkg/apis/dra-health/{v1,v1alpha1}` | a DRA driver, on its service socket |
//! | [`deviceplugin::v1beta1`] | `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1` | the kubelet (`Registration`) and each device plugin |
//! | [`podresources::v1`] | `k8s.io/kubelet/pkg/apis/podresources/v1` | the kubelet |

// Generated code is not ours to lint.
#![allow(clippy::all, clippy::pedantic, missing_docs)]

/// Kubelet plugin registration (`pluginregistration.Registration`).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");

    /// `PluginInfo.type` of a DRA driver.
    pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
    /// `PluginInfo.type` of a device plugin registering through the plugin watcher.
    pub const DEVICE_PLUGIN_TYPE: &str = "DevicePlugin";
}

/// Kubelet <-> DRA driver.
pub mod dra {
    /// `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`.
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");

        /// How a driver advertises this service in `PluginInfo.supported_versions`.
        pub const SUPPORTED_VERSION: &str = "v1.DRAPlugin";
    }

    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`, for kubelets older than 1.34.
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");

        /// How a driver advertises this service in `PluginInfo.supported_versions`.
        pub const SUPPORTED_VERSION: &str = "v1beta1.DRAPlugin";
    }

    /// Device health reported by a DRA driver to the kubelet.
    pub mod health {
        /// `v1.DRAResourceHealth` (Kubernetes 1.37): the messages of `v1alpha1`. Generated
        /// apart from the pod-resources API, whose protobuf package is `v1` too.
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/dra_health/v1.rs"));

            /// How a driver advertises this service in `PluginInfo.supported_versions`. From
            /// 1.37 the kubelet opens the health stream only for a service advertised there,
            /// the newest it knows.
            pub const SUPPORTED_VERSION: &str = "v1.DRAResourceHealth";
        }

        /// `v1alpha1.DRAResourceHealth`, which kubelets read until 1.39.
        pub mod v1alpha1 {
            tonic::include_proto!("v1alpha1");

            /// How a driver advertises this service in `PluginInfo.supported_versions`.
            /// Kubelets up to 1.36 open the health stream whatever the list says and ignore
            /// services they do not know.
            pub const SUPPORTED_VERSION: &str = "v1alpha1.DRAResourceHealth";
        }
    }
}

/// The classic device plugin API.
pub mod deviceplugin {
    /// `v1beta1.Registration` and `v1beta1.DevicePlugin`.
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");

        /// `RegisterRequest.version`.
        pub const VERSION: &str = "v1beta1";
        /// The kubelet's registration socket, inside the device-plugin directory.
        pub const KUBELET_SOCKET: &str = "kubelet.sock";
        /// `Device.health` values.
        pub const HEALTHY: &str = "Healthy";
        pub const UNHEALTHY: &str = "Unhealthy";
    }
}

/// The kubelet's pod resources API.
pub mod podresources {
    /// `v1.PodResourcesLister`.
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}
