//! What the seccomp filter of a confined command denies, as data: read by
//! this crate's build script, which has libseccomp generate the program
//! for the target architecture (by system call name, from libseccomp's own
//! tables), and by the tests. No dependencies: the build script includes
//! this file as a module of its own.

/// Calls (by name) a confined command gets EPERM for, whatever their arguments.
pub const DENIED: &[&str] = &[
    // Mounts, old and new API: the private /dev and the params overlay
    // stay in place, no new devtmpfs or procfs.
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    // Other processes.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    // Namespaces.
    "unshare",
    "setns",
    // The device filter and the kernel.
    "bpf",
    "perf_event_open",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "fanotify_init",
    "userfaultfd",
    // Files by handle: around the mount table and the private /dev.
    "open_by_handle_at",
    "name_to_handle_at",
    // Keyrings are not namespaced.
    "keyctl",
    "add_key",
    "request_key",
    // io_uring runs calls this filter does not see.
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "iopl",
    "ioperm",
    "uselib",
];

/// Every `CLONE_NEW*` flag: a `clone` with any of them is denied.
pub const NAMESPACE_FLAGS: &[u64] = &[
    0x0002_0000, // CLONE_NEWNS
    0x0400_0000, // CLONE_NEWUTS
    0x0800_0000, // CLONE_NEWIPC
    0x1000_0000, // CLONE_NEWUSER
    0x2000_0000, // CLONE_NEWPID
    0x4000_0000, // CLONE_NEWNET
    0x0200_0000, // CLONE_NEWCGROUP
    0x80,        // CLONE_NEWTIME
];

/// Calls that only some architectures have (x86-64's port I/O and
/// `uselib`): left out where the target lacks them. Every other name must
/// be known to libseccomp for the target, or the build fails.
pub const ARCH_SPECIFIC: &[&str] = &["iopl", "ioperm", "uselib"];
