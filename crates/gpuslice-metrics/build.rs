//! Generates the kubelet PodResources v1 client (and, for the tests, server)
//! from the vendored proto. The proto is compiled by protox (pure Rust): no
//! system `protoc` is needed to build gpuslice.
fn main() {
    println!("cargo:rerun-if-changed=proto/vendor/podresources_v1.proto");
    let fds = protox::compile(["proto/vendor/podresources_v1.proto"], ["proto/vendor"])
        .unwrap_or_else(|e| panic!("proto/vendor/podresources_v1.proto: {e}"));
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the PodResources client: {e}"));
}
