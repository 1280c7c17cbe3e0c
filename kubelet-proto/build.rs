//! Generates the gRPC code from `protos/` at build time; nothing generated is committed.
//! Needs `protoc` (Debian: protobuf-compiler) on PATH or in $PROTOC.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTOS: &[&str] = &[
        "protos/pluginregistration_v1.proto",
        "protos/dra_v1.proto",
        "protos/dra_v1beta1.proto",
        "protos/dra_health_v1alpha1.proto",
        "protos/deviceplugin_v1beta1.proto",
        "protos/podresources_v1.proto",
    ];
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(PROTOS, &["protos"])?;
    // DRA health v1 shares its protobuf package name, `v1`, with the pod-resources API, so
    // it is generated into a directory of its own.
    const HEALTH_V1: &str = "protos/dra_health_v1.proto";
    println!("cargo:rerun-if-changed={HEALTH_V1}");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("dra_health");
    std::fs::create_dir_all(&out)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(out)
        .compile_protos(&[HEALTH_V1], &["protos"])?;
    Ok(())
}
