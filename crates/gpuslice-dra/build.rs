//! Generates the kubelet's DRA plugin service (v1 and v1beta1), its
//! resource health service (v1alpha1, v1beta1, v1) and the plugin
//! registration service, servers and clients (the clients drive the
//! test kubelet), from the vendored protos. protox compiles them (pure
//! Rust): no system `protoc` is needed.
const PROTOS: &[&str] = &[
    "proto/vendor/dra_v1.proto",
    "proto/vendor/dra_v1beta1.proto",
    "proto/vendor/pluginregistration_v1.proto",
    "proto/vendor/dra_health_v1alpha1.proto",
    "proto/vendor/dra_health_v1beta1.proto",
    "proto/vendor/dra_health_v1.proto",
];

fn main() {
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds =
        protox::compile(PROTOS, ["proto/vendor"]).unwrap_or_else(|e| panic!("DRA protos: {e}"));
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the DRA API: {e}"));
}
