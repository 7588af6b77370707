//! Generates the kubelet device-plugin v1beta1 server and client (the
//! client registers with the kubelet and drives the test kubelet) from the
//! vendored proto. The proto is compiled by protox (pure Rust): no system
//! `protoc` is needed to build gpuslice.
fn main() {
    println!("cargo:rerun-if-changed=proto/vendor/deviceplugin_v1beta1.proto");
    let fds = protox::compile(
        ["proto/vendor/deviceplugin_v1beta1.proto"],
        ["proto/vendor"],
    )
    .unwrap_or_else(|e| panic!("proto/vendor/deviceplugin_v1beta1.proto: {e}"));
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the device-plugin API: {e}"));
}
