//! Generates the confined command's seccomp program with libseccomp, for
//! the target architecture, into `$OUT_DIR/seccomp.bpf` (native-endian
//! `struct sock_filter`s), which `src/seccomp.rs` embeds. Generated here,
//! not at run time: libseccomp's generation took longer on every launch
//! than installing the program it makes (bench/README.md).

#[path = "src/seccomp_policy.rs"]
mod policy;

use libseccomp::{
    ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=src/seccomp_policy.rs");
    let target = std::env::var("CARGO_CFG_TARGET_ARCH")?;
    let arch = match target.as_str() {
        "x86_64" => ScmpArch::X8664,
        "aarch64" => ScmpArch::Aarch64,
        other => return Err(format!("no seccomp filter for target architecture {other}").into()),
    };
    let mut ctx = ScmpFilterContext::new(ScmpAction::Allow)?;
    // The filter is for the target, whatever this build host is. Calls made
    // through any other ABI kill the thread (the default bad-arch action).
    if ScmpArch::native() != arch {
        ctx.add_arch(arch)?;
        ctx.remove_arch(ScmpArch::native())?;
    }
    // A binary tree of the calls: the kernel runs the program for every
    // call number when it installs it, so its path length is what an
    // install costs.
    ctx.set_ctl_optimize(2)?;
    let eperm = ScmpAction::Errno(libc_eperm());
    for name in policy::DENIED {
        match ScmpSyscall::from_name_by_arch(name, arch) {
            Ok(call) => {
                ctx.add_rule(eperm, call)?;
            }
            Err(_) if policy::ARCH_SPECIFIC.contains(name) => {}
            Err(e) => return Err(format!("system call {name} on {target}: {e}").into()),
        }
    }
    let clone = ScmpSyscall::from_name_by_arch("clone", arch)?;
    for &flag in policy::NAMESPACE_FLAGS {
        let cmp = ScmpArgCompare::new(0, ScmpCompareOp::MaskedEqual(flag), flag);
        ctx.add_rule_conditional(eperm, clone, &[cmp])?;
    }
    // ENOSYS, as under docker: glibc then falls back to clone, whose
    // flags the filter can read.
    ctx.add_rule(
        ScmpAction::Errno(libc_enosys()),
        ScmpSyscall::from_name_by_arch("clone3", arch)?,
    )?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("seccomp.bpf");
    ctx.export_bpf(std::fs::File::create(&out)?)?;
    Ok(())
}

// The errno values are the same on every Linux architecture we build for.
fn libc_eperm() -> i32 {
    1
}
fn libc_enosys() -> i32 {
    38
}
