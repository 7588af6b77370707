//! Generates the kubelet PodResources v1 client (and, for the tests, server)
//! from the vendored proto. Needs `protoc` (Debian: protobuf-compiler).
fn main() {
    println!("cargo:rerun-if-changed=proto/podresources_v1.proto");
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/podresources_v1.proto"], &["proto"])
        .expect(
            "generating the PodResources client needs protoc (apt-get install protobuf-compiler)",
        );
}
