//! Certificates for a throw-away control plane: one CA, the API server's serving certificate,
//! an admin client certificate (group system:masters) and the service-account signing key.

use crate::Error;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};

/// PEM files written into a control plane's directory.
pub(crate) struct Certs {
    pub ca_cert: PathBuf,
    pub ca_pem: String,
    pub ca_key: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
}

impl Certs {
    /// `host`: the API server's address, besides loopback (the same for the harness's
    /// control planes; another when pods must reach it). The serving certificate also carries
    /// the `kubernetes` Service's ClusterIP, as a cluster's does: pods' clients connect to it.
    pub fn generate(dir: &Path, host: std::net::Ipv4Addr) -> Result<Self, Error> {
        let ca_key = KeyPair::generate()?;
        let ca_params = ca_params();
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, &ca_key);

        let serving_key = KeyPair::generate()?;
        let mut serving = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default.svc".to_string(),
        ])?;
        for ip in [
            std::net::Ipv4Addr::LOCALHOST,
            host,
            crate::services::KUBERNETES_SERVICE_IP,
        ] {
            serving
                .subject_alt_names
                .push(SanType::IpAddress(ip.into()));
        }
        serving.distinguished_name = name("kube-apiserver", None);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_cert = serving.signed_by(&serving_key, &issuer)?;

        let admin_key = KeyPair::generate()?;
        let mut admin = CertificateParams::default();
        admin.distinguished_name = name("akri-testing-admin", Some("system:masters"));
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_cert = admin.signed_by(&admin_key, &issuer)?;

        let sa_key = KeyPair::generate()?;

        let write = |file: &str, pem: String| -> Result<PathBuf, Error> {
            let path = dir.join(file);
            std::fs::write(&path, pem).map_err(Error::io(format!("write {}", path.display())))?;
            Ok(path)
        };
        Ok(Certs {
            ca_cert: write("ca.crt", ca_cert.pem())?,
            ca_pem: ca_cert.pem(),
            ca_key: write("ca.key", ca_key.serialize_pem())?,
            serving_cert: write("apiserver.crt", serving_cert.pem())?,
            serving_key: write("apiserver.key", serving_key.serialize_pem())?,
            admin_cert_pem: admin_cert.pem(),
            admin_key_pem: admin_key.serialize_pem(),
            sa_key: write("sa.key", sa_key.serialize_pem())?,
            sa_pub: write("sa.pub", sa_key.public_key_pem())?,
        })
    }
}

/// The CA's parameters: the same each time, so that [`client_cert`] can sign with the CA key
/// alone.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = name("akri-testing-ca", None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

/// A client certificate and its key (PEM) for `common_name` in `organization`, signed by the
/// CA whose key [`Certs::generate`] wrote to `ca_key`: e.g. a kubelet's identity,
/// `system:node:<name>` in `system:nodes`, which the Node authorizer recognises.
pub(crate) fn client_cert(
    ca_key: &Path,
    common_name: &str,
    organization: &str,
) -> Result<(String, String), Error> {
    let pem =
        std::fs::read_to_string(ca_key).map_err(Error::io(format!("read {}", ca_key.display())))?;
    let ca_key = KeyPair::from_pem(&pem)?;
    let issuer = Issuer::new(ca_params(), &ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name, Some(organization));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}
