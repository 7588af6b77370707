//! The cgroup v2 device filter: a `BPF_PROG_TYPE_CGROUP_DEVICE` program
//! assembled by hand from a [`DevicePolicy`], loaded with `bpf(2)` and
//! attached to the slice's cgroup with `BPF_F_ALLOW_MULTI`.
//!
//! No BPF toolchain is involved: [`compile`] emits a handful of classic
//! instructions (32-bit context loads, `and`/`mov` immediates, forward
//! conditional jumps, `exit`) whose meaning is pinned by the interpreter in
//! this module's tests, which checks the program against
//! [`DevicePolicy::allows_char`] minor by minor.
//!
//! # Program layout
//!
//! The kernel calls the program with `r1` pointing at
//! `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`,
//! where `access_type = (access << 16) | dev_type`. It returns 1 to allow the
//! access and 0 to deny it.
//!
//! ```text
//!         r2 = *(u32 *)(r1 + 0)        access_type
//!         r2 &= 0xffff                 dev_type
//!         if r2 != CHAR goto allow     block devices are never restricted
//!         r2 = *(u32 *)(r1 + 4)        major
//!         r3 = *(u32 *)(r1 + 8)        minor
//!   for each rule, in policy order:
//!         if r2 != MAJOR goto next     rule does not apply
//!     deny_unlisted (allowed minors that are not also denied):
//!         if r3 == A goto next         one per single minor or pair, or
//!         if r3 < LO goto +1           two per run LO..=HI of >= 3 minors
//!         if r3 <= HI goto next
//!         goto deny
//!     otherwise (denied minors):
//!         if r3 == D goto deny         singles, pairs, and runs as above
//!   next:
//!         ...
//!   allow: r0 = 1; exit
//!   deny:  r0 = 0; exit                only emitted when something jumps here
//! ```
//!
//! A rule that lets its minor through falls (or jumps) to the next rule
//! rather than to `allow`, so a device covered by several rules must pass all
//! of them, as `allows_char` requires. For a `deny_unlisted` rule the
//! `denied` list needs no instructions of its own: a minor in both lists is
//! dropped from the allowed set, and everything outside that set is denied.
//! Rules that can deny nothing (not `deny_unlisted`, no denied minors) are
//! skipped. For an 8-GPU host with one GPU selected (NVIDIA rule, caps rule,
//! DRM rule) this comes to about 23 instructions.
//!
//! Comparisons are 64-bit against a sign-extended 32-bit immediate, which is
//! exact for every device number the kernel can produce (majors have 12
//! bits and minors 20). A policy value above `i32::MAX` cannot name a real
//! device, and the emitted comparison never matches one either.

use gpuslice_core::{DevicePolicy, MajorRule};
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

/// One eBPF instruction, laid out as the kernel's `struct bpf_insn`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Opcode: class | size/op | source.
    pub code: u8,
    /// Destination register in the low nibble, source register in the high one.
    pub regs: u8,
    /// Jump offset (relative to the next instruction) or memory offset.
    pub off: i16,
    /// Immediate operand.
    pub imm: i32,
}

const _: () = assert!(std::mem::size_of::<Insn>() == 8);

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        Self {
            code,
            regs: (dst & 0x0f) | (src << 4),
            off,
            imm,
        }
    }

    /// Destination register.
    pub fn dst(&self) -> u8 {
        self.regs & 0x0f
    }

    /// Source register.
    pub fn src(&self) -> u8 {
        self.regs >> 4
    }
}

// Opcode pieces (include/uapi/linux/bpf_common.h, bpf.h).
pub(crate) const BPF_LDX: u8 = 0x01;
pub(crate) const BPF_JMP: u8 = 0x05;
pub(crate) const BPF_ALU64: u8 = 0x07;
pub(crate) const BPF_W: u8 = 0x00;
pub(crate) const BPF_MEM: u8 = 0x60;
pub(crate) const BPF_K: u8 = 0x00;
pub(crate) const BPF_AND: u8 = 0x50;
pub(crate) const BPF_MOV: u8 = 0xb0;
pub(crate) const BPF_JA: u8 = 0x00;
pub(crate) const BPF_JEQ: u8 = 0x10;
pub(crate) const BPF_JNE: u8 = 0x50;
pub(crate) const BPF_JLT: u8 = 0xa0;
pub(crate) const BPF_JLE: u8 = 0xb0;
pub(crate) const BPF_EXIT: u8 = 0x90;

/// `BPF_DEVCG_DEV_BLOCK`.
pub const DEV_BLOCK: u32 = 1;
/// `BPF_DEVCG_DEV_CHAR`.
pub const DEV_CHAR: u32 = 2;
/// `BPF_DEVCG_ACC_MKNOD`, `_READ`, `_WRITE` (shifted left 16 in `access_type`).
pub const ACC_MKNOD: u32 = 1;
pub const ACC_READ: u32 = 2;
pub const ACC_WRITE: u32 = 4;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;

#[derive(Clone, Copy)]
struct Label(usize);

/// A tiny assembler: instructions plus forward jumps to labels, resolved in
/// [`Asm::finish`].
struct Asm {
    insns: Vec<Insn>,
    /// (index of the jump instruction, its target)
    fixups: Vec<(usize, Label)>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn new() -> Self {
        Self {
            insns: Vec::new(),
            fixups: Vec::new(),
            labels: Vec::new(),
        }
    }

    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }

    fn used(&self, l: Label) -> bool {
        self.fixups.iter().any(|(_, t)| t.0 == l.0)
    }

    fn emit(&mut self, insn: Insn) {
        self.insns.push(insn);
    }

    /// `dst = *(u32 *)(src + off)`
    fn ldx_w(&mut self, dst: u8, src: u8, off: i16) {
        self.emit(Insn::new(BPF_LDX | BPF_W | BPF_MEM, dst, src, off, 0));
    }

    fn alu64_imm(&mut self, op: u8, dst: u8, imm: i32) {
        self.emit(Insn::new(BPF_ALU64 | op | BPF_K, dst, 0, 0, imm));
    }

    /// Conditional jump `if dst <op> imm goto target`.
    fn jmp_imm(&mut self, op: u8, dst: u8, imm: u32, target: Label) {
        self.fixups.push((self.insns.len(), target));
        // Reinterpreting the bits is intended: the kernel sign-extends the
        // immediate, which keeps every real device number exact (module docs).
        self.emit(Insn::new(BPF_JMP | op | BPF_K, dst, 0, 0, imm as i32));
    }

    /// `if dst < imm goto +skip` (a jump over a fixed number of instructions).
    fn jmp_imm_skip(&mut self, op: u8, dst: u8, imm: u32, skip: i16) {
        self.emit(Insn::new(BPF_JMP | op | BPF_K, dst, 0, skip, imm as i32));
    }

    fn ja(&mut self, target: Label) {
        self.fixups.push((self.insns.len(), target));
        self.emit(Insn::new(BPF_JMP | BPF_JA, 0, 0, 0, 0));
    }

    fn exit_with(&mut self, r0: i32) {
        self.alu64_imm(BPF_MOV, R0, r0);
        self.emit(Insn::new(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
    }

    /// Jump to `target` when `r3` is one of `minors` (sorted, deduplicated).
    fn minor_in(&mut self, minors: &[u32], target: Label) {
        for run in runs(minors) {
            let (lo, hi) = (run[0], run[run.len() - 1]);
            if run.len() >= 3 {
                self.jmp_imm_skip(BPF_JLT, R3, lo, 1);
                self.jmp_imm(BPF_JLE, R3, hi, target);
            } else {
                for &m in run {
                    self.jmp_imm(BPF_JEQ, R3, m, target);
                }
            }
        }
    }

    fn finish(mut self) -> Vec<Insn> {
        for (at, target) in std::mem::take(&mut self.fixups) {
            let dest = self.labels[target.0].expect("jump to an unbound label");
            let off = dest as isize - (at as isize + 1);
            self.insns[at].off = i16::try_from(off)
                .expect("BPF jump offset out of range: policy has too many minors");
        }
        self.insns
    }
}

/// Splits sorted, deduplicated minors into runs of consecutive values.
fn runs(minors: &[u32]) -> impl Iterator<Item = &[u32]> {
    minors.chunk_by(|a, b| a.checked_add(1) == Some(*b))
}

fn sorted(v: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut v: Vec<u32> = v.into_iter().collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Compiles `policy` into a `BPF_PROG_TYPE_CGROUP_DEVICE` program that
/// allows a char device exactly when [`DevicePolicy::allows_char`] does, and
/// every block device. The layout is described in the module docs.
///
/// # Panics
///
/// If a jump would span more than 32767 instructions, which takes tens of
/// thousands of non-consecutive minors (no real policy comes near).
pub fn compile(policy: &DevicePolicy) -> Vec<Insn> {
    let mut a = Asm::new();
    let allow = a.label();
    let deny = a.label();

    let rules: Vec<&MajorRule> = policy
        .rules
        .iter()
        .filter(|r| r.deny_unlisted || !r.denied.is_empty())
        .collect();

    a.ldx_w(R2, R1, 0);
    a.alu64_imm(BPF_AND, R2, 0xffff);
    a.jmp_imm(BPF_JNE, R2, DEV_CHAR, allow);
    if !rules.is_empty() {
        a.ldx_w(R2, R1, 4);
        a.ldx_w(R3, R1, 8);
    }
    for rule in rules {
        let next = a.label();
        a.jmp_imm(BPF_JNE, R2, rule.major, next);
        if rule.deny_unlisted {
            let allowed = sorted(
                rule.allowed
                    .iter()
                    .copied()
                    .filter(|m| !rule.denied.contains(m)),
            );
            a.minor_in(&allowed, next);
            a.ja(deny);
        } else {
            a.minor_in(&sorted(rule.denied.iter().copied()), deny);
        }
        a.bind(next);
    }
    a.bind(allow);
    a.exit_with(1);
    // The verifier rejects unreachable instructions: emit the deny exit only
    // when some rule can deny.
    if a.used(deny) {
        a.bind(deny);
        a.exit_with(0);
    }
    a.finish()
}

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to `expected_attach_type`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for `BPF_PROG_ATTACH`, up to `replace_bpf_fd`.
#[repr(C)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

/// `bpf(cmd, attr, size_of::<A>())`, returning its non-negative result.
fn sys_bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, exclusively borrowed `#[repr(C)]` prefix of
    // `union bpf_attr` whose size we pass, and every pointer stored in it
    // (by the callers below) outlives this call. The kernel reads at most
    // `size` bytes and writes only into buffers those pointers describe.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A as *mut libc::c_void,
            std::mem::size_of::<A>() as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// One `BPF_PROG_LOAD` attempt, with `log` as the verifier log buffer when
/// given (log level 1).
fn prog_load(insns: &[Insn], log: Option<&mut [u8]>) -> io::Result<OwnedFd> {
    const LICENSE: &CStr = c"GPL";
    let mut name = [0u8; 16];
    name[..12].copy_from_slice(b"gpuslice_dev");
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: u32::try_from(insns.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "program too long"))?,
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        prog_name: name,
        ..Default::default()
    };
    if let Some(buf) = log {
        attr.log_level = 1;
        attr.log_size = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        attr.log_buf = buf.as_mut_ptr() as u64;
    }
    let fd = sys_bpf(BPF_PROG_LOAD, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("bpf() returned a bad fd"))?;
    // SAFETY: a successful BPF_PROG_LOAD returns a new file descriptor (opened
    // with O_CLOEXEC) that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Loads a device-filter program (`BPF_PROG_TYPE_CGROUP_DEVICE`, license
/// GPL). On failure the error keeps the kind of the first attempt's errno
/// and its message carries the verifier log (on one line).
///
/// Needs `CAP_BPF` + `CAP_SYS_ADMIN` (or root) and `CONFIG_CGROUP_BPF`.
pub fn load(insns: &[Insn]) -> io::Result<OwnedFd> {
    // The first attempt runs without a log: with a log, a buffer that turns
    // out too small would fail an otherwise good load with ENOSPC.
    let err = match prog_load(insns, None) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    let mut buf = vec![0u8; 1 << 20];
    if let Ok(fd) = prog_load(insns, Some(&mut buf)) {
        return Ok(fd);
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let log = String::from_utf8_lossy(&buf[..end]);
    let log: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let mut log = log.join(" | ");
    const KEEP: usize = 4000;
    if log.len() > KEEP {
        let mut cut = log.len() - KEEP;
        while !log.is_char_boundary(cut) {
            cut += 1;
        }
        log = format!("…{}", &log[cut..]);
    }
    if log.is_empty() {
        log = "(empty)".into();
    }
    Err(io::Error::new(
        err.kind(),
        format!(
            "BPF_PROG_LOAD of a {}-instruction device filter failed: {err}; verifier log: {log}",
            insns.len()
        ),
    ))
}

/// Attaches a loaded device filter to the cgroup (v2) directory `cgroup_dir`
/// with `BPF_F_ALLOW_MULTI`, so it runs alongside the programs of ancestor
/// cgroups (all must allow). The attachment holds its own reference to the
/// program: `prog` may be closed afterwards, and the filter lives until the
/// cgroup is removed.
pub fn attach(cgroup_dir: &Path, prog: impl AsFd) -> io::Result<()> {
    let dir = File::open(cgroup_dir)?;
    attach_fd(dir.as_fd(), prog.as_fd())
}

/// [`attach`] to an already open cgroup directory.
pub fn attach_fd(cgroup: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = ProgAttachAttr {
        target_fd: cgroup.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        replace_bpf_fd: 0,
    };
    sys_bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cgroup::test_support::rule;
    use gpuslice_core::MigDevice;
    use gpuslice_core::{Inventory, Selection};

    /// Runs `prog` on one `bpf_cgroup_dev_ctx`, interpreting exactly the
    /// opcodes `compile` emits, and checking what the verifier would:
    /// registers are written before they are read, jumps stay inside the
    /// program and go forward, and the program ends in `exit`.
    pub(crate) fn run(prog: &[Insn], access_type: u32, major: u32, minor: u32) -> u64 {
        let ctx = [access_type, major, minor];
        let mut reg = [0u64; 11];
        let mut init = [false; 11];
        init[1] = true; // r1 = ctx
        let mut pc = 0usize;
        let read = |init: &[bool; 11], r: u8| {
            assert!(init[r as usize], "r{r} read before written");
        };
        loop {
            let i = *prog
                .get(pc)
                .unwrap_or_else(|| panic!("fell off the end at {pc}"));
            let (dst, src) = (i.dst() as usize, i.src());
            let imm64 = i.imm as i64 as u64; // sign-extended, as the kernel does
            let mut next = pc + 1;
            let jump = |cond: bool| {
                assert!(i.off >= 0, "backward jump at {pc}");
                let t = pc as isize + 1 + i.off as isize;
                assert!((0..prog.len() as isize).contains(&t), "jump out at {pc}");
                if cond {
                    t as usize
                } else {
                    pc + 1
                }
            };
            match i.code {
                c if c == BPF_LDX | BPF_W | BPF_MEM => {
                    assert_eq!(src, 1, "load from r{src}, not the ctx");
                    assert!(matches!(i.off, 0 | 4 | 8), "ctx offset {}", i.off);
                    reg[dst] = ctx[i.off as usize / 4] as u64;
                    init[dst] = true;
                }
                c if c == BPF_ALU64 | BPF_AND | BPF_K => {
                    read(&init, dst as u8);
                    reg[dst] &= imm64;
                }
                c if c == BPF_ALU64 | BPF_MOV | BPF_K => {
                    reg[dst] = imm64;
                    init[dst] = true;
                }
                c if c == BPF_JMP | BPF_JA => next = jump(true),
                c if c == BPF_JMP | BPF_JEQ | BPF_K => {
                    read(&init, dst as u8);
                    next = jump(reg[dst] == imm64);
                }
                c if c == BPF_JMP | BPF_JNE | BPF_K => {
                    read(&init, dst as u8);
                    next = jump(reg[dst] != imm64);
                }
                c if c == BPF_JMP | BPF_JLT | BPF_K => {
                    read(&init, dst as u8);
                    next = jump(reg[dst] < imm64);
                }
                c if c == BPF_JMP | BPF_JLE | BPF_K => {
                    read(&init, dst as u8);
                    next = jump(reg[dst] <= imm64);
                }
                c if c == BPF_JMP | BPF_EXIT => {
                    read(&init, 0);
                    return reg[0];
                }
                c => panic!("opcode {c:#04x} at {pc} not emitted by compile"),
            }
            pc = next;
        }
    }

    /// Every instruction is reachable (the verifier rejects programs where
    /// one is not).
    fn assert_all_reachable(prog: &[Insn]) {
        let mut seen = vec![false; prog.len()];
        let mut todo = vec![0usize];
        while let Some(pc) = todo.pop() {
            if pc >= prog.len() || std::mem::replace(&mut seen[pc], true) {
                continue;
            }
            let i = prog[pc];
            let target = (pc as isize + 1 + i.off as isize) as usize;
            match i.code {
                c if c == BPF_JMP | BPF_EXIT => {}
                c if c == BPF_JMP | BPF_JA => todo.push(target),
                c if c & 0x07 == BPF_JMP => todo.extend([pc + 1, target]),
                _ => todo.push(pc + 1),
            }
        }
        let dead: Vec<usize> = (0..prog.len()).filter(|&p| !seen[p]).collect();
        assert!(dead.is_empty(), "unreachable instructions {dead:?}");
    }

    const MAJORS: [u32; 5] = [1, 195, 226, 238, 241];

    /// Interpreter result equals `allows_char` for every minor 0..=300 of
    /// the interesting majors, for each access type, and block devices are
    /// always allowed.
    pub(crate) fn check(policy: &DevicePolicy) {
        let prog = compile(policy);
        assert_all_reachable(&prog);
        // Majors have 12 bits: the kernel never passes a larger one.
        let majors = policy.rules.iter().map(|r| r.major).filter(|&m| m < 4096);
        for major in MAJORS.into_iter().chain(majors) {
            for minor in 0..=300 {
                let want = policy.allows_char(major, minor) as u64;
                for acc in [
                    ACC_MKNOD,
                    ACC_READ,
                    ACC_WRITE,
                    ACC_READ | ACC_WRITE | ACC_MKNOD,
                ] {
                    let got = run(&prog, (acc << 16) | DEV_CHAR, major, minor);
                    assert_eq!(got, want, "c {major}:{minor} acc {acc} {policy:?}");
                    let blk = run(&prog, (acc << 16) | DEV_BLOCK, major, minor);
                    assert_eq!(blk, 1, "b {major}:{minor} {policy:?}");
                }
            }
        }
    }

    pub(crate) fn shapes() -> Vec<DevicePolicy> {
        let p = |rules: Vec<MajorRule>| DevicePolicy { rules };
        vec![
            p(vec![]),
            p(vec![rule(195, &[], &[], false)]),
            p(vec![rule(195, &[], &[], true)]),
            p(vec![rule(195, &[1, 254, 255], &[0, 2, 3], true)]),
            p(vec![rule(195, &[1, 254, 255], &[], true)]),
            p(vec![rule(195, &[], &[0, 2, 3], true)]),
            p(vec![rule(195, &[], &[0, 2, 3], false)]),
            p(vec![rule(195, &[5, 6], &[0, 2, 3], false)]),
            // A minor both allowed and denied is denied.
            p(vec![rule(195, &[1, 2, 255], &[2], true)]),
            p(vec![rule(195, &[1, 2], &[2, 3], false)]),
            // Runs of every length, unsorted, duplicated, at the edges.
            p(vec![rule(
                195,
                &[0, 1, 2, 3, 9, 8, 7, 7, 20, 21, 300],
                &[],
                true,
            )]),
            p(vec![rule(
                226,
                &[],
                &[0, 1, 2, 4, 5, 7, 100, 101, 102, 103, 299, 300],
                false,
            )]),
            // Several majors, and the same major twice (both must allow).
            p(vec![
                rule(195, &[0, 254, 255], &[1, 2, 3, 4, 5, 6, 7], true),
                rule(241, &[12, 13], &[21, 22], true),
                rule(226, &[1, 129], &[2, 3, 130, 131], false),
            ]),
            p(vec![
                rule(195, &[0, 1, 2, 255], &[], true),
                rule(195, &[], &[1], false),
            ]),
            p(vec![
                rule(195, &[0, 1, 2, 255], &[], true),
                rule(195, &[2, 3], &[], true),
            ]),
            // Rules for majors no device here uses, and huge values.
            p(vec![rule(4095, &[], &[0], false), rule(1, &[3], &[], true)]),
            p(vec![rule(
                195,
                &[u32::MAX, 255, 0x8000_0000],
                &[i32::MAX as u32],
                true,
            )]),
            p(vec![
                rule(u32::MAX, &[], &[], true),
                rule(0x8000_00c3, &[], &[1], false),
            ]),
        ]
    }

    #[test]
    fn every_rule_shape_matches_allows_char() {
        for p in shapes() {
            check(&p);
        }
    }

    /// A small deterministic PRNG (xorshift64*), enough for policy fuzzing.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u32 {
            (self.next() % n) as u32
        }
        fn minors(&mut self) -> Vec<u32> {
            let mut v = Vec::new();
            for _ in 0..self.below(6) {
                // Single minors and runs, sometimes overlapping.
                let start = self.below(310);
                let max = if self.below(3) == 0 { 12 } else { 2 };
                let len = 1 + self.below(max);
                v.extend(start..start + len);
            }
            v
        }
    }

    #[test]
    fn random_policies_match_allows_char() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..400 {
            let rules = (0..rng.below(5))
                .map(|_| MajorRule {
                    major: MAJORS[rng.below(MAJORS.len() as u64) as usize],
                    allowed: rng.minors(),
                    denied: rng.minors(),
                    deny_unlisted: rng.below(2) == 0,
                })
                .collect();
            check(&DevicePolicy { rules });
        }
    }

    fn inventory(n: u32, migs: bool) -> Inventory {
        let mut inv = Inventory::fake(n);
        if migs {
            for g in &mut inv.gpus {
                let i = g.index;
                g.migs = (0..3)
                    .map(|m| MigDevice {
                        index: m,
                        gi_access_minor: Some(10 + i * 20 + m * 3),
                        ci_access_minor: Some(11 + i * 20 + m * 3),
                        ..Default::default()
                    })
                    .collect();
            }
        }
        inv
    }

    #[test]
    fn real_selections_match_and_stay_small() {
        let inv = inventory(8, false);
        let one = DevicePolicy::for_selection(&inv, &Selection::gpus([1]));
        let prog = compile(&one);
        assert!(prog.len() <= 25, "{} instructions: {prog:#?}", prog.len());
        for sel in [
            Selection::default(),
            Selection::gpus([0]),
            Selection::gpus([1, 5]),
            Selection::gpus(0..8),
        ] {
            check(&DevicePolicy::for_selection(&inv, &sel));
        }
        let inv = inventory(4, true);
        for sel in [
            Selection::gpus([2]),
            Selection {
                gpus: vec![],
                migs: vec![(0, 1), (3, 2)],
            },
        ] {
            let p = DevicePolicy::for_selection(&inv, &sel);
            check(&p);
            assert!(compile(&p).len() <= 40);
        }
    }

    #[test]
    fn layout_of_a_typical_policy() {
        let p = DevicePolicy {
            rules: vec![rule(195, &[1, 254, 255], &[0, 2], true)],
        };
        let code: Vec<(u8, u8, i16, i32)> = compile(&p)
            .iter()
            .map(|i| (i.code, i.regs, i.off, i.imm))
            .collect();
        assert_eq!(
            code,
            vec![
                (0x61, 0x12, 0, 0),      // r2 = *(u32 *)(r1 + 0)
                (0x57, 0x02, 0, 0xffff), // r2 &= 0xffff
                (0x55, 0x02, 7, 2),      // if r2 != 2 goto allow
                (0x61, 0x12, 4, 0),      // r2 = major
                (0x61, 0x13, 8, 0),      // r3 = minor
                (0x55, 0x02, 4, 195),    // if r2 != 195 goto next
                (0x15, 0x03, 3, 1),      // if r3 == 1 goto next
                (0x15, 0x03, 2, 254),    // if r3 == 254 goto next
                (0x15, 0x03, 1, 255),    // if r3 == 255 goto next
                (0x05, 0x00, 2, 0),      // goto deny
                (0xb7, 0x00, 0, 1),      // allow: r0 = 1
                (0x95, 0x00, 0, 0),      // exit
                (0xb7, 0x00, 0, 0),      // deny: r0 = 0
                (0x95, 0x00, 0, 0),      // exit
            ]
        );
    }

    /// As root: a program the verifier rejects fails with its log in the
    /// error, on one line.
    #[test]
    fn load_error_carries_the_verifier_log() {
        let test = "load_error_carries_the_verifier_log";
        if !gpuslice_testkit::precondition(test, gpuslice_testkit::needs_root()) {
            return;
        }
        // `exit` without setting r0.
        let bad = [Insn::new(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)];
        let err = load(&bad).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("verifier log: ") && msg.contains("R0 !read_ok"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
    }

    /// As root: every shape passes the real verifier, and a denied node
    /// gives EPERM in a cgroup with the filter while an allowed one gets
    /// through to the driver, as it does outside the cgroup (ENXIO where no
    /// driver has the major).
    #[test]
    fn kernel_enforces_the_filter() {
        use crate::cgroup::test_support as ts;
        let Some(root) = ts::v2_root_or_skip("kernel_enforces_the_filter") else {
            return;
        };
        for p in shapes() {
            let prog = compile(&p);
            if let Err(e) = load(&prog) {
                panic!("{p:?}: {e}");
            }
        }
        let policy = DevicePolicy {
            rules: vec![
                rule(195, &[0, 254, 255], &[1, 2, 3], true),
                rule(226, &[], &[7], false),
            ],
        };
        let prog = load(&compile(&policy)).expect("load");
        let cg = ts::TestCgroup::new(&root, "bpftest");
        attach(cg.path(), &prog).expect("attach");
        drop(prog);
        let nodes = ts::NodeDir::new();
        let cases = [
            (195, 1, true),
            (195, 3, true),
            (195, 9, true),
            (195, 0, false),
            (195, 255, false),
            (226, 7, true),
            (226, 8, false),
        ];
        for (major, minor, denied) in cases {
            let node = nodes.mknod(major, minor);
            let outside = ts::open_errno(&node);
            assert_ne!(outside, libc::EPERM, "c {major}:{minor} outside the cgroup");
            let want = if denied { libc::EPERM } else { outside };
            let got = ts::open_errno_in(cg.path(), &node);
            assert_eq!(got, want, "c {major}:{minor}: errno {got}, wanted {want}");
        }
    }
}
