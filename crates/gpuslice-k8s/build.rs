//! Generates the kubelet device-plugin v1beta1 server and client (the
//! client registers with the kubelet and drives the test kubelet) from the
//! vendored proto. Needs `protoc` (Debian: protobuf-compiler).
fn main() {
    println!("cargo:rerun-if-changed=proto/deviceplugin_v1beta1.proto");
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/deviceplugin_v1beta1.proto"], &["proto"])
        .expect(
            "generating the device-plugin API needs protoc (apt-get install protobuf-compiler)",
        );
}
