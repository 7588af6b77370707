//! Link like the real libcuda: references between the library's own entry
//! points (its cuGetProcAddress table, internal calls) bind inside the
//! library, so an LD_PRELOADed interposer such as libgpuslice.so replaces
//! only what callers look up, never the driver's own idea of its functions.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
}
