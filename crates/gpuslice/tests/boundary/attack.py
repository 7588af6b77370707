# Attacks a slice's command makes with raw system calls (ctypes), for
# tests/boundary.rs and scripts/device_all.sh PART boundary. Each prints
# one word: "ok" when the call succeeded (the attack got through), else
# the errno's name (EPERM, ESRCH...).
import ctypes, errno, os, struct, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long


def syscall(nr, *args):
    # syscall(2) is variadic and reads every argument as a long: a Python
    # int passed bare is a C int, whose register's upper half is garbage
    # (process_vm_readv's flags then read non-zero: EINVAL, now and then).
    return libc.syscall(L(nr), *(L(a) if isinstance(a, int) else a for a in args))
NR = {"x86_64": {"bpf": 321, "process_vm_readv": 310},
      "aarch64": {"bpf": 280, "process_vm_readv": 270}}[os.uname().machine]


def result(rc):
    if rc < 0:
        return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    return "ok"


def ptrace(pid):
    PTRACE_SEIZE, PTRACE_DETACH = 0x4206, 17
    rc = libc.ptrace(PTRACE_SEIZE, int(pid), None, None)
    out = result(rc)
    if rc == 0:
        libc.ptrace(PTRACE_DETACH, int(pid), None, None)
    return out


def vmread(pid):
    # The first readable mapping of the target, from its maps (readable
    # only when it is visible and we may ptrace-read it).
    try:
        with open(f"/proc/{pid}/maps") as f:
            addr = next(int(l.split("-")[0], 16) for l in f if l.split()[1].startswith("r"))
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    buf = ctypes.create_string_buffer(8)
    local = struct.pack("QQ", ctypes.addressof(buf), 8)
    remote = struct.pack("QQ", addr, 8)
    rc = syscall(NR["process_vm_readv"], int(pid), local, 1, remote, 1, 0)
    return result(rc)


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, 128)
    rc = syscall(NR["bpf"], cmd, buf, 128)
    return rc, buf


def bpf_detach(cgroup_dir):
    """Detaches every device program of the cgroup (what bpftool cgroup detach does)."""
    BPF_PROG_DETACH, BPF_PROG_GET_FD_BY_ID, BPF_PROG_QUERY, BPF_CGROUP_DEVICE = 9, 13, 16, 6
    cg = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
    ids = (ctypes.c_uint32 * 64)()
    rc, buf = bpf(BPF_PROG_QUERY, struct.pack("IIIIQI", cg, BPF_CGROUP_DEVICE, 0, 0,
                                              ctypes.addressof(ids), 64))
    if rc < 0:
        return result(rc)
    count = struct.unpack_from("I", buf, 24)[0]
    if count == 0:
        return "none-attached"
    for i in range(count):
        rc, _ = bpf(BPF_PROG_GET_FD_BY_ID, struct.pack("I", ids[i]))
        if rc < 0:
            return result(rc)
        rc, _ = bpf(BPF_PROG_DETACH, struct.pack("IIII", cg, rc, BPF_CGROUP_DEVICE, 0))
        if rc < 0:
            return result(rc)
    return "ok"


print({"ptrace": ptrace, "vmread": vmread, "bpf-detach": bpf_detach}[sys.argv[1]](*sys.argv[2:]))
