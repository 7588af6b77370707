//! Test helper: a CUDA driver API client for the shim's tests (run under
//! `LD_PRELOAD=libgpuslice.so` against the fake driver). Not a user tool;
//! it lives in gpuslice-testkit so that no product crate carries it.
//!
//! It loads `libcuda.so.1` with `dlopen` and takes entry points the way
//! real programs do, chosen by `--via`:
//! - `dlsym`: `dlsym(handle, "cuMemAlloc_v2")` (like cudart's loader);
//! - `procaddr`: `cuGetProcAddress_v2("cuMemAlloc", 13000, flags)` (like
//!   CUDA 12+ runtimes and PyTorch), itself found with dlsym;
//! - `global`: libcuda loaded RTLD_GLOBAL and `dlsym(RTLD_DEFAULT, …)`,
//!   which binds like a program linked against libcuda.
//!
//! Commands (each prints JSON lines):
//! - `paths`: every allocation path once: rc, ledger use after alloc and
//!   after free.
//! - `fill BLOCK [async]`: cuMemAlloc (`async`: cuMemAllocAsync on the
//!   NULL stream) BLOCK bytes until it fails; reports count, the failing
//!   rc, cuMemGetInfo, the ledger and NVML when full; frees all.
//! - `stress SECONDS SEED MAX_BLOCK`: random alloc/free, checking the
//!   ledger never passes the cap; frees all.
//! - `capture COUNT SIZE`: stream-ordered allocations while streams
//!   capture (COUNT of SIZE bytes on a created stream in global mode, the per-thread stream through the
//!   `_ptsz` flavour, and a normal allocation while another thread
//!   captures): every return code, the ledger during capture, after the
//!   graph's launch and after the graph memory is trimmed.
//! - `cycle N SIZE`: N cuMemAlloc(SIZE) + cuMemFree cycles; prints the
//!   nanoseconds per cycle (the shim's cost on the hot path, with and
//!   without a cap).
//! - `pool-destroy BYTES FREE`: a pool destroyed with an allocation
//!   outstanding, then the allocation freed with FREE (`cuMemFreeAsync` or
//!   `cuMemFree`): [ledger, NVML] after each step.
//! - `arrays`: a small plain array and deferred-mapping ones: rc and the
//!   change of the ledger and of NVML's figure for each.
//! - `set-limit LIMIT VALUE`: `cuCtxSetLimit`'s rc, the limit read back,
//!   [ledger, NVML] before and after.
//! - `hold BYTES`: allocates, prints `held`, sleeps until killed.
//! - `info-32`: the 32-bit ABI's `cuMemGetInfo` and `cuDeviceTotalMem`
//!   (their unsuffixed names) on device 0: rc and figures of each.
//! - `dlvsym NAME...`: what `dlvsym` gives for each NAME in libcuda's
//!   handle and in `RTLD_DEFAULT`, under several versions: the defining
//!   file.
//! - `addr NAME`: prints the address `--via` gives for NAME and the file
//!   that defines it.
//! - `compute MODE KERNEL_NS SECONDS WARMUP`: launches kernels of
//!   KERNEL_NS simulated nanoseconds (the fake driver reads the duration
//!   from the first kernel parameter) back to back for WARMUP + SECONDS,
//!   synchronising every 8 launches; MODE picks the entry point:
//!   `kernel`, `ptsz` (`cuLaunchKernel_ptsz` on the NULL stream), `ex`
//!   (`cuLaunchKernelEx`), `coop` (`cuLaunchCooperativeKernel`) or `graph`
//!   (`cuGraphLaunch`; the graph runs `$FAKEGPU_GRAPH_NS`). Prints the
//!   simulated GPU busy time and the wall time of the last SECONDS.
//! - `shared-stream KERNEL_NS ROUNDS`: two threads launch on one stream.
//!   Each round the main thread launches 4 kernels of KERNEL_NS and waits
//!   5 ms (its work is done), a second thread launches one 2 ms kernel,
//!   and 0.2 ms later the main thread launches one more while the stream
//!   is busy with the other thread's kernel; then it synchronises. Prints
//!   the simulated GPU busy time.

use std::ffi::{c_int, c_uint, c_void, CStr, CString};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuslice_cuda_abi::cuda::{
    pfn, Array3DDescriptor, ArrayDescriptor, CUarray, CUmemAllocationProp, CUmemPoolProps,
    CUresult as R, LaunchConfig, MemAllocNodeParams, CUDA_ARRAY3D_DEFERRED_MAPPING,
    CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
    CU_MEM_ALLOCATION_TYPE_MANAGED, CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE,
    CU_MEM_LOCATION_TYPE_HOST, CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_PER_THREAD, LIBCUDA,
};
use gpuslice_cuda_abi::fakegpu;
use gpuslice_cuda_abi::nvml::{pfn as nvml_pfn, NvmlProcessInfo};
use gpuslice_ledger::Ledger;

type Gpa = pfn::GetProcAddress;

struct Cuda {
    handle: *mut c_void,
    via: String,
    gpa: Option<Gpa>,
}

impl Cuda {
    fn load(via: &str) -> Cuda {
        let flags = if via == "global" {
            libc::RTLD_NOW | libc::RTLD_GLOBAL
        } else {
            libc::RTLD_NOW | libc::RTLD_LOCAL
        };
        let name = CString::new(LIBCUDA).unwrap();
        // SAFETY: plain dlopen of a NUL-terminated name.
        let handle = unsafe { libc::dlopen(name.as_ptr(), flags) };
        assert!(!handle.is_null(), "dlopen {LIBCUDA} failed");
        let mut c = Cuda {
            handle,
            via: via.to_string(),
            gpa: None,
        };
        let gpa = c.dlsym("cuGetProcAddress_v2");
        if !gpa.is_null() {
            // SAFETY: cuGetProcAddress_v2's signature.
            c.gpa = Some(unsafe { std::mem::transmute::<*mut c_void, Gpa>(gpa) });
        }
        c
    }

    fn dlsym(&self, name: &str) -> *mut c_void {
        let n = CString::new(name).unwrap();
        let h = if self.via == "global" {
            libc::RTLD_DEFAULT
        } else {
            self.handle
        };
        // SAFETY: valid handle and name.
        unsafe { libc::dlsym(h, n.as_ptr()) }
    }

    /// The entry point for `base` (`exact` is its exported name).
    fn get(&self, base: &str, exact: &str) -> *mut c_void {
        if self.via == "procaddr" {
            let gpa = self.gpa.expect("cuGetProcAddress_v2");
            let n = CString::new(base).unwrap();
            let mut p = std::ptr::null_mut();
            let mut status = -1;
            let flags = if exact.ends_with("_ptsz") {
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
            } else {
                CU_GET_PROC_ADDRESS_DEFAULT
            };
            // SAFETY: valid arguments.
            let rc = unsafe { gpa(n.as_ptr(), &mut p, 13000, flags, &mut status) };
            if rc != 0 {
                return std::ptr::null_mut();
            }
            p
        } else {
            self.dlsym(exact)
        }
    }
}

/// A driver entry point as its `pfn` type: `f!(cu, MemAlloc, "_v2")` is
/// `cuMemAlloc` (exported as `cuMemAlloc_v2`) as `pfn::MemAlloc`; the long
/// form names the base, the exported name and the type apart.
macro_rules! f {
    ($cu:expr, $name:ident $(, $suffix:literal)?) => {
        f!(
            $cu,
            concat!("cu", stringify!($name)),
            concat!("cu", stringify!($name) $(, $suffix)?),
            pfn::$name
        )
    };
    ($cu:expr, $base:expr, $exact:expr, $ty:ty) => {{
        let p = $cu.get($base, $exact);
        assert!(!p.is_null(), "no entry point {}", $exact);
        // SAFETY: the driver function's C signature.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

/// The calls that run a built graph and give its memory back.
struct GraphExec {
    instantiate: pfn::GraphInstantiateWithFlags,
    launch: pfn::GraphLaunch,
    exec_destroy: pfn::GraphExecDestroy,
    graph_trim: pfn::DeviceGraphMemTrim,
}

impl GraphExec {
    fn load(cu: &Cuda) -> Self {
        GraphExec {
            instantiate: f!(cu, GraphInstantiateWithFlags),
            launch: f!(cu, GraphLaunch),
            exec_destroy: f!(cu, GraphExecDestroy),
            graph_trim: f!(cu, DeviceGraphMemTrim),
        }
    }

    /// Instantiates `graph` and launches it on `stream`: both codes and
    /// the exec.
    ///
    /// # Safety
    /// `graph` and `stream` are the driver's live handles (or null).
    unsafe fn run(&self, graph: *mut c_void, stream: *mut c_void) -> (R, R, *mut c_void) {
        let mut exec = std::ptr::null_mut();
        // SAFETY: a live out-pointer and the caller's handles.
        unsafe {
            let rc_instantiate = (self.instantiate)(&mut exec, graph, 0);
            (rc_instantiate, (self.launch)(exec, stream), exec)
        }
    }

    /// Destroys `exec`, then trims device 0's graph memory: both codes.
    ///
    /// # Safety
    /// `exec` came from `run` and is destroyed once.
    unsafe fn retire(&self, exec: *mut c_void) -> (R, R) {
        // SAFETY: the caller's exec; the trim takes a device ordinal.
        unsafe { ((self.exec_destroy)(exec), (self.graph_trim)(0)) }
    }
}

fn ledger() -> Option<Ledger> {
    let p = std::env::var(gpuslice_ledger::limits::ENV_LEDGER).ok()?;
    Ledger::open(Path::new(&p)).ok()
}

fn used() -> u64 {
    ledger().map_or(0, |l| l.used(0))
}

fn init(cu: &Cuda) {
    let cu_init = f!(cu, Init);
    let retain = f!(cu, DevicePrimaryCtxRetain);
    let set = f!(cu, CtxSetCurrent);
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        assert_eq!(cu_init(0), 0, "cuInit");
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0, "primary context");
        assert_eq!(set(ctx), 0, "set current");
    }
    settle_contexts(0..1);
}

/// The shim charges a new context at its estimate and measures it in the
/// background: waits (up to 5 s) for that on `devices` (the fake contexts
/// are smaller), so what a command charges next is seen against a settled
/// baseline.
fn settle_contexts(devices: std::ops::Range<usize>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while devices
        .clone()
        .any(|d| ledger().map_or(0, |l| l.used(d)) >= CONTEXT_ESTIMATE)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn line(kv: &[(&str, String)]) {
    let body: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    println!("{{{}}}", body.join(","));
    let _ = std::io::stdout().flush();
}

/// How much `now` grew since `was` (negative when it shrank).
fn change(now: u64, was: u64) -> i128 {
    now as i128 - was as i128
}

fn q(s: &str) -> String {
    format!("\"{s}\"")
}

/// How a path makes its allocation: written to the handle it is given.
type Make<'a, H> = &'a dyn Fn(&mut H) -> R;

/// One path: make an allocation into `handle` with `alloc`, record use,
/// give it back with `free`.
fn path<H: Copy>(
    name: &str,
    mut handle: H,
    alloc: impl FnOnce(&mut H) -> R,
    free: impl FnOnce(H) -> R,
) {
    let before = used();
    let rc = alloc(&mut handle);
    let during = used();
    let frc = if rc == 0 { free(handle) } else { -1 };
    line(&[
        ("path", q(name)),
        ("rc", rc.to_string()),
        ("free_rc", frc.to_string()),
        ("charged", change(during, before).to_string()),
        ("after_free", change(used(), before).to_string()),
    ]);
}

const MIB: usize = 1 << 20;

fn paths(cu: &Cuda) {
    let alloc = f!(cu, MemAlloc, "_v2");
    let free = f!(cu, MemFree, "_v2");
    let pitch = f!(cu, MemAllocPitch, "_v2");
    let managed = f!(cu, MemAllocManaged);
    // The allocations cuMemFree gives back.
    let freed: [(&str, Make<u64>); 3] = [
        // SAFETY: valid out-pointer.
        ("cuMemAlloc", &|p| unsafe { alloc(p, 3 * MIB) }),
        ("cuMemAllocPitch", &|p| {
            let mut pitch_out = 0;
            // SAFETY: valid out-pointers.
            unsafe { pitch(p, &mut pitch_out, 1000, 1024, 4) }
        }),
        // SAFETY: valid out-pointer.
        ("cuMemAllocManaged", &|p| unsafe { managed(p, 5 * MIB, 1) }),
    ];
    for (name, alloc) in freed {
        // SAFETY: frees the allocation just made, once.
        path(name, 0, alloc, |p| unsafe { free(p) });
    }

    for exact in ["cuMemAllocAsync", "cuMemAllocAsync_ptsz"] {
        let a = f!(cu, "cuMemAllocAsync", exact, pfn::MemAllocAsync);
        let fr_name = exact.replace("Alloc", "Free");
        let fr = f!(cu, "cuMemFreeAsync", &fr_name, pfn::MemFreeAsync);
        path(
            exact,
            0,
            // SAFETY: valid out-pointer, default stream.
            |p| unsafe { a(p, 7 * MIB, std::ptr::null_mut()) },
            |p| free_and_trim(cu, fr, p, std::ptr::null_mut()),
        );
    }

    let create_pool = f!(cu, MemPoolCreate);
    let destroy_pool = f!(cu, MemPoolDestroy);
    let from_pool = f!(cu, MemAllocFromPoolAsync);
    let free_async = f!(cu, MemFreeAsync);
    let mut pool = std::ptr::null_mut();
    let props = pool_props(
        CU_MEM_ALLOCATION_TYPE_PINNED,
        CU_MEM_LOCATION_TYPE_DEVICE,
        0,
    );
    // SAFETY: valid out-pointer; the fake reads location from the props.
    let prc = unsafe { create_pool(&mut pool, &props) };
    assert_eq!(prc, 0, "cuMemPoolCreate");
    path(
        "cuMemAllocFromPoolAsync",
        0,
        // SAFETY: valid arguments.
        |p| unsafe { from_pool(p, 9 * MIB, pool, std::ptr::null_mut()) },
        // SAFETY: p came from the pool above; the pool is destroyed after its last allocation.
        |p| unsafe {
            let rc = free_async(p, std::ptr::null_mut());
            destroy_pool(pool);
            rc
        },
    );

    let create = f!(cu, MemCreate);
    let release = f!(cu, MemRelease);
    let prop = device0_prop();
    path(
        "cuMemCreate",
        0,
        // SAFETY: valid arguments.
        |h| unsafe { create(h, 4 * MIB, &prop, 0) },
        // SAFETY: h is the handle created above, released once.
        |h| unsafe { release(h) },
    );

    let arr2 = f!(cu, ArrayCreate, "_v2");
    let arr3 = f!(cu, Array3DCreate, "_v2");
    let arr_destroy = f!(cu, ArrayDestroy);
    let mip = f!(cu, MipmappedArrayCreate);
    let mip_destroy = f!(cu, MipmappedArrayDestroy);
    let d2 = ArrayDescriptor {
        width: 1024,
        height: 1024,
        format: 0x20,
        num_channels: 1,
    };
    let (d3, dm) = (
        array3d(256, 256, 16, 0x01, 0),
        array3d(512, 512, 0, 0x20, 0),
    );
    let null = std::ptr::null_mut();
    // (name, create, destroy)
    let arrays: [(&str, Make<CUarray>, pfn::ArrayDestroy); 3] = [
        // SAFETY: valid arguments.
        ("cuArrayCreate", &|a| unsafe { arr2(a, &d2) }, arr_destroy),
        // SAFETY: valid arguments.
        ("cuArray3DCreate", &|a| unsafe { arr3(a, &d3) }, arr_destroy),
        (
            "cuMipmappedArrayCreate",
            // SAFETY: valid arguments.
            &|a| unsafe { mip(a, &dm, 4) },
            mip_destroy,
        ),
    ];
    for (name, create, destroy) in arrays {
        // SAFETY: destroys the array just created, once.
        path(name, null, create, |a| unsafe { destroy(a) });
    }

    // Graph memory: a graph with one allocation node, launched, then the
    // graph pool trimmed after the exec is gone.
    let graph_create = f!(cu, GraphCreate);
    let add_alloc = f!(cu, GraphAddMemAllocNode);
    let graph_exec = GraphExec::load(cu);
    path(
        "graph mem node",
        null,
        // SAFETY: the graph calls get live out-pointers and the handles they returned.
        |exec| unsafe {
            let mut g = std::ptr::null_mut();
            assert_eq!(graph_create(&mut g, 0), 0);
            let mut params = MemAllocNodeParams {
                pool_props: pool_props(
                    CU_MEM_ALLOCATION_TYPE_PINNED,
                    CU_MEM_LOCATION_TYPE_DEVICE,
                    0,
                ),
                access_descs: std::ptr::null(),
                access_desc_count: 0,
                bytesize: 11 * MIB,
                dptr: 0,
            };
            let mut node = std::ptr::null_mut();
            assert_eq!(add_alloc(&mut node, g, std::ptr::null(), 0, &mut params), 0);
            let (rc_instantiate, rc_launch, launched) = graph_exec.run(g, std::ptr::null_mut());
            assert_eq!(rc_instantiate, 0);
            *exec = launched;
            rc_launch
        },
        // SAFETY: exec is the graph instantiated above, destroyed once.
        |exec| unsafe { graph_exec.retire(exec).1 },
    );
}

/// Frees `p` with `free` on `stream`, then trims device 0's default pool to
/// nothing, so that what was freed goes back to the device.
fn free_and_trim(cu: &Cuda, free: pfn::MemFreeAsync, p: u64, stream: *mut c_void) -> R {
    let get_pool = f!(cu, DeviceGetMemPool);
    let trim = f!(cu, MemPoolTrimTo);
    // SAFETY: frees the caller's allocation once, then trims the pool the
    // driver names.
    unsafe {
        let rc = free(p, stream);
        let mut pool = std::ptr::null_mut();
        get_pool(&mut pool, 0);
        trim(pool, 0);
        rc
    }
}

const STREAM_PER_THREAD: *mut c_void = CU_STREAM_PER_THREAD as *mut c_void;

fn list(v: &[R]) -> String {
    let items: Vec<String> = v.iter().map(R::to_string).collect();
    format!("[{}]", items.join(","))
}

/// Captures `allocs` stream-ordered allocations of `size` on `stream`
/// (allocated with `alloc`), asks for mem info during the capture, ends
/// it, launches the graph, then destroys it and trims graph memory;
/// prints every return code and the ledger along the way.
fn capture_one(
    cu: &Cuda,
    name: &str,
    stream: *mut c_void,
    alloc: pfn::MemAllocAsync,
    allocs: usize,
    size: usize,
) {
    let begin = f!(cu, StreamBeginCapture, "_v2");
    let end = f!(cu, StreamEndCapture);
    let is_capturing = f!(cu, StreamIsCapturing);
    let graph_exec = GraphExec::load(cu);
    let before = used();
    // SAFETY: driver calls with valid arguments and out-pointers.
    unsafe {
        let rc_begin = begin(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
        let rc_allocs: Vec<R> = (0..allocs)
            .map(|_| {
                let mut p = 0;
                alloc(&mut p, size, stream)
            })
            .collect();
        let (rc_info, _, _) = mem_info(cu);
        let mut status = -1;
        let rc_status = is_capturing(stream, &mut status);
        let during = used();
        let mut graph = std::ptr::null_mut();
        let rc_end = end(stream, &mut graph);
        let (rc_inst, rc_launch, exec) = graph_exec.run(graph, stream);
        let launched = used();
        let (rc_destroy, rc_trim) = graph_exec.retire(exec);
        line(&[
            ("path", q(name)),
            ("rc_begin", rc_begin.to_string()),
            ("rc_allocs", list(&rc_allocs)),
            ("rc_mem_info", rc_info.to_string()),
            ("rc_is_capturing", rc_status.to_string()),
            ("status", status.to_string()),
            ("rc_end", rc_end.to_string()),
            ("rc_instantiate", rc_inst.to_string()),
            ("rc_launch", rc_launch.to_string()),
            ("rc_exec_destroy", rc_destroy.to_string()),
            ("rc_trim", rc_trim.to_string()),
            ("graph_bytes", (allocs * size).to_string()),
            ("charged_during", change(during, before).to_string()),
            ("charged_launched", change(launched, before).to_string()),
            ("after_trim", change(used(), before).to_string()),
        ]);
    }
}

fn capture(cu: &Cuda, count: usize, size: usize) {
    let create = f!(cu, StreamCreate);
    let alloc = f!(cu, MemAllocAsync);
    let alloc_ptsz = f!(cu, MemAllocAsync, "_ptsz");
    let mut s = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { create(&mut s, 0) }, 0, "cuStreamCreate");
    capture_one(cu, "created stream", s, alloc, count, size);
    // The per-thread stream, named as the _ptsz flavour's NULL stream.
    let begin = f!(cu, StreamBeginCapture, "_v2");
    let end = f!(cu, StreamEndCapture);
    let before = used();
    // SAFETY: driver calls with valid arguments and out-pointers.
    unsafe {
        let rc_begin = begin(STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_GLOBAL);
        let mut p = 0;
        let rc_alloc = alloc_ptsz(&mut p, 6 * MIB, std::ptr::null_mut());
        let during = used();
        let mut graph = std::ptr::null_mut();
        let rc_end = end(STREAM_PER_THREAD, &mut graph);
        line(&[
            ("path", q("per-thread stream")),
            ("rc_begin", rc_begin.to_string()),
            ("rc_alloc", rc_alloc.to_string()),
            ("rc_end", rc_end.to_string()),
            ("charged_during", change(during, before).to_string()),
        ]);
    }
    other_thread_captures(cu, alloc);
}

/// Another thread captures in global mode while this one allocates on a
/// stream that does not capture: charged as usual, and the other capture
/// survives (the shim's own queries must not be prohibited calls).
fn other_thread_captures(cu: &Cuda, alloc: pfn::MemAllocAsync) {
    let create = f!(cu, StreamCreate);
    let begin = f!(cu, StreamBeginCapture, "_v2");
    let end = f!(cu, StreamEndCapture);
    let get_ctx = f!(cu, CtxGetCurrent);
    let set_ctx = f!(cu, CtxSetCurrent);
    let free_async = f!(cu, MemFreeAsync);
    let mut ctx = std::ptr::null_mut();
    let (mut mine, mut theirs) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(get_ctx(&mut ctx), 0);
        assert_eq!(create(&mut mine, 0), 0);
        assert_eq!(create(&mut theirs, 0), 0);
    }
    let (ctx, theirs) = (ctx as usize, theirs as usize);
    let (began_tx, began_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        // SAFETY: driver calls with valid arguments and out-pointers.
        unsafe {
            set_ctx(ctx as *mut c_void);
            began_tx
                .send(begin(theirs as *mut c_void, CU_STREAM_CAPTURE_MODE_GLOBAL))
                .unwrap();
            go_rx.recv().unwrap();
            let mut graph = std::ptr::null_mut();
            end(theirs as *mut c_void, &mut graph)
        }
    });
    let rc_begin = began_rx.recv().unwrap();
    let before = used();
    let mut p = 0;
    // SAFETY: valid out-pointer and stream.
    let rc_alloc = unsafe { alloc(&mut p, 8 * MIB, mine) };
    let charged = change(used(), before);
    let (rc_info, _, _) = mem_info(cu);
    go_tx.send(()).unwrap();
    let rc_end = other.join().unwrap();
    let rc_free = free_and_trim(cu, free_async, p, mine);
    line(&[
        ("path", q("other thread captures")),
        ("rc_begin", rc_begin.to_string()),
        ("rc_alloc", rc_alloc.to_string()),
        ("rc_mem_info", rc_info.to_string()),
        ("rc_end", rc_end.to_string()),
        ("rc_free", rc_free.to_string()),
        ("charged", charged.to_string()),
        ("after_free", change(used(), before).to_string()),
    ]);
}

fn mem_info(cu: &Cuda) -> (R, usize, usize) {
    let info = f!(cu, MemGetInfo, "_v2");
    let (mut free, mut total) = (0, 0);
    // SAFETY: valid out-pointers.
    let rc = unsafe { info(&mut free, &mut total) };
    (rc, free, total)
}

/// See `info-32` in the module docs.
fn info_32(cu: &Cuda) {
    let info = f!(cu, "cuMemGetInfo", "cuMemGetInfo", pfn::MemGetInfoV1);
    let device_total = f!(
        cu,
        "cuDeviceTotalMem",
        "cuDeviceTotalMem",
        pfn::DeviceTotalMemV1
    );
    let (mut free, mut total, mut bytes) = (0, 0, 0);
    // SAFETY: valid out-pointers; device 0 exists.
    let (rc, rc_total) = unsafe { (info(&mut free, &mut total), device_total(&mut bytes, 0)) };
    let mut kv = mem_info_fields(rc, free, total);
    kv.push(("rc_total", rc_total.to_string()));
    kv.push(("device_total", bytes.to_string()));
    line(&kv);
}

/// What `info` prints of a `cuMemGetInfo*`: its rc and figures.
fn mem_info_fields(
    rc: R,
    free: impl ToString,
    total: impl ToString,
) -> Vec<(&'static str, String)> {
    vec![
        ("rc", rc.to_string()),
        ("free", free.to_string()),
        ("total", total.to_string()),
    ]
}

fn fill(cu: &Cuda, block: usize, stream_ordered: bool) {
    let alloc = f!(cu, MemAlloc, "_v2");
    let free = f!(cu, MemFree, "_v2");
    let alloc_async = f!(cu, MemAllocAsync);
    let free_async = f!(cu, MemFreeAsync);
    let (_, free0, total0) = mem_info(cu);
    let mut ptrs = Vec::new();
    let rc = loop {
        let mut p = 0;
        // SAFETY: valid out-pointer; the NULL stream.
        let rc = unsafe {
            match stream_ordered {
                true => alloc_async(&mut p, block, std::ptr::null_mut()),
                false => alloc(&mut p, block),
            }
        };
        if rc != 0 || ptrs.len() > 100_000 {
            break rc;
        }
        ptrs.push(p);
    };
    let (_, free_full, _) = mem_info(cu);
    let (used_full, nvml_full) = (used(), nvml_own());
    for &p in &ptrs {
        // SAFETY: frees our own allocations.
        let rc = unsafe {
            match stream_ordered {
                true => free_async(p, std::ptr::null_mut()),
                false => free(p),
            }
        };
        assert_eq!(rc, 0);
    }
    line(&[
        ("count", ptrs.len().to_string()),
        ("bytes", (ptrs.len() * block).to_string()),
        ("fail_rc", rc.to_string()),
        ("total", total0.to_string()),
        ("free_before", free0.to_string()),
        ("free_full", free_full.to_string()),
        ("ledger_full", used_full.to_string()),
        ("nvml_full", nvml_full.to_string()),
        ("ledger_after", used().to_string()),
    ]);
}

fn stress(cu: &Cuda, secs: f64, mut rng: u64, max_block: usize) -> i32 {
    let alloc = f!(cu, MemAlloc, "_v2");
    let free = f!(cu, MemFree, "_v2");
    let l = ledger().expect("GPUSLICE_LEDGER");
    let cap = l.cap(0);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut held: Vec<u64> = Vec::new();
    let (mut ok, mut oom, mut max_seen, mut bad) = (0u64, 0u64, 0u64, 0u64);
    rng |= 1;
    while Instant::now() < deadline {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if rng % 100 < 55 && held.len() < 64 {
            let size = (rng >> 8) as usize % max_block + 1;
            let mut p = 0;
            // SAFETY: valid out-pointer.
            match unsafe { alloc(&mut p, size) } {
                0 => {
                    ok += 1;
                    held.push(p);
                }
                2 => oom += 1,
                _ => bad += 1,
            }
        } else if !held.is_empty() {
            let i = (rng >> 16) as usize % held.len();
            // SAFETY: frees our own allocation.
            if unsafe { free(held.swap_remove(i)) } != 0 {
                bad += 1;
            }
        }
        let u = l.used(0);
        max_seen = max_seen.max(u);
    }
    for p in held {
        // SAFETY: frees our own allocation.
        unsafe { free(p) };
    }
    line(&[
        ("ok", ok.to_string()),
        ("oom", oom.to_string()),
        ("bad", bad.to_string()),
        ("max_seen", max_seen.to_string()),
        ("cap", cap.to_string()),
    ]);
    if max_seen > cap || bad > 0 {
        3
    } else {
        0
    }
}

/// Each NAME looked up with `dlvsym` in libcuda's handle and in
/// `RTLD_DEFAULT`, with versions a program might try (not the empty one:
/// glibc dereferences a null version name for it): one line per lookup
/// with the file that defines what came back ("" for none).
fn dlvsym_lookups(cu: &Cuda, names: &[String]) {
    for name in names {
        for (which, h) in [("handle", cu.handle), ("default", libc::RTLD_DEFAULT)] {
            for version in ["GLIBC_2.2.5", "GLIBC_2.34", "CUDA_12.0", "libcuda.so.1"] {
                let (n, v) = (
                    CString::new(name.as_str()).unwrap(),
                    CString::new(version).unwrap(),
                );
                // SAFETY: a live handle (or RTLD_DEFAULT) and NUL-terminated strings.
                let p = unsafe { libc::dlvsym(h, n.as_ptr(), v.as_ptr()) };
                line(&[
                    ("name", q(name)),
                    ("handle", q(which)),
                    ("version", q(version)),
                    ("file", format!("{:?}", file_of(p))),
                ]);
            }
        }
    }
}

fn file_of(p: *mut c_void) -> String {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr fills info.
    if p.is_null() || unsafe { libc::dladdr(p, info.as_mut_ptr()) } == 0 {
        return String::new();
    }
    // SAFETY: initialised by dladdr; fname is NUL-terminated.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return String::new();
    }
    // SAFETY: as above.
    unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned()
}

/// The fake driver's `fakegpuBusyNs`: GPU time device `d` has completed.
fn fake_busy(cu: &Cuda) -> impl Fn(c_int) -> u64 {
    let busy_p = cu.dlsym("fakegpuBusyNs");
    assert!(!busy_p.is_null(), "fakegpuBusyNs");
    // SAFETY: the fake driver's test hook's prototype.
    let busy_f = unsafe { std::mem::transmute::<*mut c_void, fakegpu::BusyNs>(busy_p) };
    // SAFETY: a plain call of the test hook.
    move |d: c_int| unsafe { busy_f(d) }
}

/// The kernel the compute commands launch (the fake driver takes any
/// function and reads the simulated duration from the first parameter).
const FAKE_KERNEL: *mut c_void = 0x1000 as *mut c_void;

/// One 1×1×1 launch of the fake kernel through `launch`.
///
/// # Safety
/// `stream` is live (or null) and `params` the kernel's parameters, alive
/// during the call.
unsafe fn launch_one(
    launch: pfn::LaunchKernel,
    stream: *mut c_void,
    params: *mut *mut c_void,
) -> R {
    let null = std::ptr::null_mut();
    // SAFETY: the caller's stream and parameters; no `extra`.
    unsafe { launch(FAKE_KERNEL, 1, 1, 1, 1, 1, 1, 0, stream, params, null) }
}

fn compute(cu: &Cuda, mode: &str, kernel_ns: u64, seconds: f64, warmup: f64) {
    let busy = fake_busy(cu);
    let records_p = cu.dlsym("fakegpuEventRecords");
    assert!(!records_p.is_null(), "fakegpuEventRecords");
    // SAFETY: the fake driver's test hook's prototype.
    let records_f = unsafe { std::mem::transmute::<*mut c_void, fakegpu::EventRecords>(records_p) };
    // SAFETY: a plain call of the test hook.
    let records = || unsafe { records_f() };
    let sync = f!(cu, CtxSynchronize);
    let stream_create = f!(cu, StreamCreate);
    let mut stream = std::ptr::null_mut();
    if mode != "ptsz" {
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { stream_create(&mut stream, 0) }, 0);
    }
    let mut ns = kernel_ns;
    let mut params = [(&mut ns as *mut u64).cast::<c_void>()];
    let mut exec = std::ptr::null_mut();
    if mode == "graph" {
        let create = f!(cu, GraphCreate);
        let inst = f!(cu, GraphInstantiateWithFlags);
        let mut g = std::ptr::null_mut();
        // SAFETY: valid out-pointers.
        unsafe {
            assert_eq!(create(&mut g, 0), 0);
            assert_eq!(inst(&mut exec, g, 0), 0);
        }
    }
    let launch: Box<dyn FnMut() -> R> = match mode {
        "kernel" | "ptsz" => {
            // `ptsz` launches on the NULL stream (no stream was made).
            let f = match mode {
                "ptsz" => f!(cu, LaunchKernel, "_ptsz"),
                _ => f!(cu, LaunchKernel),
            };
            // SAFETY: a live stream (or the NULL one); params[0] points to a u64.
            Box::new(move || unsafe { launch_one(f, stream, params.as_mut_ptr()) })
        }
        "coop" => {
            let f = f!(cu, LaunchCooperativeKernel);
            // SAFETY: as above.
            Box::new(move || unsafe {
                f(
                    FAKE_KERNEL,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                )
            })
        }
        "ex" => {
            let f = f!(cu, LaunchKernelEx);
            let cfg = LaunchConfig {
                grid: [1; 3],
                block: [1; 3],
                shared_mem: 0,
                stream,
                attrs: std::ptr::null_mut(),
                num_attrs: 0,
            };
            // SAFETY: as above.
            Box::new(move || unsafe {
                f(&cfg, FAKE_KERNEL, params.as_mut_ptr(), std::ptr::null_mut())
            })
        }
        "graph" => {
            let f = f!(cu, GraphLaunch);
            // SAFETY: an instantiated graph.
            Box::new(move || unsafe { f(exec, stream) })
        }
        other => panic!("unknown mode {other}"),
    };
    let mut launch = launch;
    let t0 = Instant::now();
    let mut mark: Option<(Instant, u64, u64, u64)> = None;
    let mut n: u64 = 0;
    loop {
        let el = t0.elapsed().as_secs_f64();
        if mark.is_none() && el >= warmup {
            mark = Some((Instant::now(), busy(0), n, records()));
        }
        if el >= warmup + seconds {
            break;
        }
        assert_eq!(launch(), 0, "launch {mode}");
        n += 1;
        if n.is_multiple_of(8) {
            // SAFETY: plain call.
            assert_eq!(unsafe { sync() }, 0);
        }
    }
    let (m, b0, n0, r0) = mark.expect("warm-up shorter than the run");
    let b1 = busy(0);
    let r1 = records();
    let wall = m.elapsed().as_nanos();
    line(&[
        ("busy_ns", (b1 - b0).to_string()),
        ("wall_ns", wall.to_string()),
        ("launches", (n - n0).to_string()),
        ("event_records", (r1 - r0).to_string()),
        ("share", format!("{:.4}", (b1 - b0) as f64 / wall as f64)),
    ]);
    // SAFETY: plain call.
    unsafe { sync() };
}

/// See `shared-stream` in the module docs.
fn shared_stream(cu: &Cuda, kernel_ns: u64, rounds: u32) {
    let busy = fake_busy(cu);
    let sync = f!(cu, CtxSynchronize);
    let get_ctx = f!(cu, CtxGetCurrent);
    let set_ctx = f!(cu, CtxSetCurrent);
    let stream_create = f!(cu, StreamCreate);
    let launch = f!(cu, LaunchKernel);
    let (mut ctx, mut stream) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid out-pointers.
    unsafe {
        assert_eq!(get_ctx(&mut ctx), 0);
        assert_eq!(stream_create(&mut stream, 0), 0);
    }
    // Raw pointers are not Send: they cross to the other thread as numbers.
    let (ctx, stream) = (ctx as usize, stream as usize);
    let kernel = move |ns: u64| {
        let mut ns = ns;
        let mut params = [(&mut ns as *mut u64).cast::<c_void>()];
        // SAFETY: valid arguments; params[0] points to a u64 that outlives
        // the call (the fake driver reads it during the launch).
        let rc = unsafe { launch_one(launch, stream as *mut c_void, params.as_mut_ptr()) };
        assert_eq!(rc, 0, "launch");
    };
    let (go, rx) = std::sync::mpsc::channel::<bool>();
    let (done_tx, done) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        // SAFETY: the context the main thread uses.
        assert_eq!(unsafe { set_ctx(ctx as *mut c_void) }, 0);
        while let Ok(long) = rx.recv() {
            kernel(if long { 2_000_000 } else { 1_000 });
            done_tx.send(()).unwrap();
        }
    });
    let b0 = busy(0);
    let t0 = Instant::now();
    for _ in 0..rounds {
        (0..4).for_each(|_| kernel(kernel_ns));
        std::thread::sleep(Duration::from_millis(5));
        go.send(true).unwrap();
        done.recv().unwrap();
        std::thread::sleep(Duration::from_micros(200));
        kernel(kernel_ns);
        // SAFETY: plain call.
        assert_eq!(unsafe { sync() }, 0);
    }
    // A last tiny launch each, so both threads settle what they measured.
    go.send(false).unwrap();
    done.recv().unwrap();
    drop(go);
    other.join().unwrap();
    kernel(1_000);
    // SAFETY: plain call.
    assert_eq!(unsafe { sync() }, 0);
    line(&[
        ("busy_ns", (busy(0) - b0).to_string()),
        ("wall_ns", t0.elapsed().as_nanos().to_string()),
    ]);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut via = "dlsym".to_string();
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--via" {
            via = it.next().expect("--via MODE");
        } else {
            rest.push(a);
        }
    }
    let cu = Cuda::load(&via);
    let cmd = rest.first().map(String::as_str).unwrap_or("");
    if cmd == "addr" {
        let name = &rest[1];
        let base = name.trim_end_matches("_v2").trim_end_matches("_ptsz");
        let p = cu.get(base, name);
        line(&[
            ("addr", (p as usize).to_string()),
            ("file", format!("{:?}", file_of(p))),
        ]);
        return;
    }
    if cmd == "dlvsym" {
        dlvsym_lookups(&cu, &rest[1..]);
        return;
    }
    match cmd {
        "hold-soft" => hold_soft(&cu, parse(&rest, 1, "BYTES")),
        "nvml-procs" => nvml_procs(),
        "resolver" => resolver(parse(&rest, 1, "IDLE")),
        _ => {}
    }
    init(&cu);
    match cmd {
        "resident" => resident(&cu),
        "paths" => paths(&cu),
        "fill" => {
            let stream_ordered = rest.get(2).is_some_and(|m| m == "async");
            fill(&cu, parse(&rest, 1, "BLOCK"), stream_ordered);
        }
        "info-32" => info_32(&cu),
        "info" => {
            let (rc, free, total) = mem_info(&cu);
            line(&mem_info_fields(rc, free, total));
        }
        "capture" => capture(&cu, parse(&rest, 1, "COUNT"), parse(&rest, 2, "SIZE")),
        "cycle" => cycle(&cu, parse(&rest, 1, "N"), parse(&rest, 2, "SIZE")),
        "compute" => compute(
            &cu,
            &rest[1],
            parse(&rest, 2, "KERNEL_NS"),
            parse(&rest, 3, "SECONDS"),
            parse(&rest, 4, "WARMUP"),
        ),
        "shared-stream" => {
            shared_stream(&cu, parse(&rest, 1, "KERNEL_NS"), parse(&rest, 2, "ROUNDS"))
        }
        "stress" => std::process::exit(stress(
            &cu,
            parse(&rest, 1, "SECONDS"),
            parse(&rest, 2, "SEED"),
            parse(&rest, 3, "MAX_BLOCK"),
        )),
        "vmm-mapped" => vmm_mapped(&cu, parse(&rest, 1, "BYTES")),
        "async-device" => async_on_other_device(&cu, parse(&rest, 1, "BYTES")),
        "pool-location" => pool_location(&cu, parse(&rest, 1, "BYTES")),
        "arrays" => arrays(&cu),
        "set-limit" => set_limit(&cu, parse(&rest, 1, "LIMIT"), parse(&rest, 2, "VALUE")),
        "pool-destroy" => pool_destroy(&cu, parse(&rest, 1, "BYTES"), &rest[2]),
        "fork" => fork_keeps_charges(&cu, parse(&rest, 1, "BYTES")),
        "two-devices" => two_devices(&cu, parse(&rest, 1, "BYTES0"), parse(&rest, 2, "BYTES1")),
        "hold" => hold(&cu, parse(&rest, 1, "BYTES")),
        other => {
            eprintln!("unknown command {other:?}");
            std::process::exit(2)
        }
    }
    std::process::exit(0);
}

/// The command's argument `i` parsed as a `T`; panics naming `what` when it
/// does not parse.
fn parse<T: std::str::FromStr>(rest: &[String], i: usize, what: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    rest[i].parse().expect(what)
}

/// `n` cycles of cuMemAlloc(`size`) + cuMemFree: the nanoseconds per cycle.
fn cycle(cu: &Cuda, n: u64, size: usize) {
    let alloc = f!(cu, MemAlloc, "_v2");
    let free = f!(cu, MemFree, "_v2");
    let t = Instant::now();
    for _ in 0..n {
        let mut p = 0;
        // SAFETY: valid out-pointer; frees what it allocated.
        unsafe {
            assert_eq!(alloc(&mut p, size), 0);
            assert_eq!(free(p), 0);
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    line(&[
        ("cycles", n.to_string()),
        ("ns_per_cycle", format!("{ns:.1}")),
    ]);
}

/// Allocates `bytes`, prints `held RC` and sleeps until killed.
fn hold(cu: &Cuda, bytes: usize) -> ! {
    let alloc = f!(cu, MemAlloc, "_v2");
    let mut p = 0;
    // SAFETY: valid out-pointer.
    let rc = unsafe { alloc(&mut p, bytes) };
    println!("held {rc}");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Driver-held memory: context, a module, a heap limit, the reported total.
fn resident(cu: &Cuda) {
    let load = f!(cu, ModuleLoadData);
    let unload = f!(cu, ModuleUnload);
    let set_limit = f!(cu, CtxSetLimit);
    let total = f!(cu, DeviceTotalMem, "_v2");
    let context = used();
    let mut m = std::ptr::null_mut();
    let image = [0u8; 16];
    // SAFETY: valid out-pointer and image buffer.
    let rc_load = unsafe { load(&mut m, image.as_ptr().cast()) };
    let with_module = used();
    // CU_LIMIT_MALLOC_HEAP_SIZE = 2.
    // SAFETY: plain driver call.
    let rc_heap = unsafe { set_limit(2, 64 * MIB) };
    let with_heap = used();
    let mut t = 0usize;
    // SAFETY: valid out-pointer.
    let rc_total = unsafe { total(&mut t, 0) };
    let rc_unload = if rc_load == 0 {
        // SAFETY: the module just loaded.
        unsafe { unload(m) }
    } else {
        -1
    };
    let unloaded = used();
    // SAFETY: plain driver call; back to the default 8 MiB.
    let rc_heap_back = unsafe { set_limit(2, 8 * MIB) };
    line(&[
        ("context", context.to_string()),
        ("rc_load", rc_load.to_string()),
        ("module", (with_module - context).to_string()),
        ("rc_heap", rc_heap.to_string()),
        ("heap", change(with_heap, with_module).to_string()),
        ("rc_total", rc_total.to_string()),
        ("total", t.to_string()),
        ("rc_unload", rc_unload.to_string()),
        ("after_unload", change(unloaded, context).to_string()),
        ("rc_heap_back", rc_heap_back.to_string()),
        ("after_heap_back", change(used(), context).to_string()),
    ]);
}

/// Arrays the real driver backs differently from their size: a small
/// plain 1D array (whole 2 MiB pages) and deferred-mapping 3D and
/// mipmapped arrays (no memory until mapped). Per case: [rc, change of the
/// ledger, change of NVML's figure], the array alive.
fn arrays(cu: &Cuda) {
    let arr3 = f!(cu, Array3DCreate, "_v2");
    let mip = f!(cu, MipmappedArrayCreate);
    let desc = |width, height, flags| array3d(width, height, 0, 0x01, flags);
    let mut kv = Vec::new();
    // (name, descriptor, mip levels; 0: a plain array).
    for (name, d, levels) in [
        ("small_1d", desc(65536, 0, 0), 0),
        (
            "deferred_2d",
            desc(1024, 1024, CUDA_ARRAY3D_DEFERRED_MAPPING),
            0,
        ),
        (
            "deferred_mipmapped",
            desc(1024, 1024, CUDA_ARRAY3D_DEFERRED_MAPPING),
            4,
        ),
    ] {
        let before = (used(), nvml_own());
        let mut a = std::ptr::null_mut();
        // SAFETY: valid descriptor and out-pointer; the arrays stay alive
        // until exit.
        let rc = unsafe {
            match levels {
                0 => arr3(&mut a, &d),
                n => mip(&mut a, &d, n),
            }
        };
        kv.push((
            name,
            format!(
                "[{rc},{},{}]",
                change(used(), before.0),
                change(nvml_own(), before.1)
            ),
        ));
    }
    line(&kv);
}

/// `cuCtxSetLimit(limit, value)`: its rc, the limit read back, and
/// [ledger, NVML] before and after.
fn set_limit(cu: &Cuda, limit: c_int, value: usize) {
    let set = f!(cu, CtxSetLimit);
    let get = f!(cu, CtxGetLimit);
    let before = (used(), nvml_own());
    // SAFETY: plain driver calls with a valid out-pointer.
    let (rc, mut now) = (unsafe { set(limit, value) }, 0usize);
    // SAFETY: as above.
    let rc_get = unsafe { get(&mut now, limit) };
    let after = (used(), nvml_own());
    line(&[
        ("rc", rc.to_string()),
        ("rc_get", rc_get.to_string()),
        ("limit", now.to_string()),
        ("before", format!("[{},{}]", before.0, before.1)),
        ("after", format!("[{},{}]", after.0, after.1)),
    ]);
}

/// Creates the primary context and allocates `bytes` without asserting
/// (either may be refused), reports both codes, and holds until killed.
fn hold_soft(cu: &Cuda, bytes: usize) -> ! {
    let cu_init = f!(cu, Init);
    let retain = f!(cu, DevicePrimaryCtxRetain);
    let set = f!(cu, CtxSetCurrent);
    let alloc = f!(cu, MemAlloc, "_v2");
    let mut ctx = std::ptr::null_mut();
    let mut p = 0;
    // SAFETY: plain driver calls with valid out-pointers.
    let (rc_ctx, rc_alloc) = unsafe {
        assert_eq!(cu_init(0), 0, "cuInit");
        let rc_ctx = retain(&mut ctx, 0);
        let rc_alloc = if rc_ctx == 0 {
            set(ctx);
            alloc(&mut p, bytes)
        } else {
            -1
        };
        (rc_ctx, rc_alloc)
    };
    line(&[("ctx", rc_ctx.to_string()), ("alloc", rc_alloc.to_string())]);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// NVML's per-process usage of GPU index 0, as the host sums it.
/// (pid, bytes) of every process NVML lists on GPU 0.
fn nvml_list() -> Vec<(u32, u64)> {
    // SAFETY: dlopen/dlsym of NVML by name; signatures from nvml.h.
    unsafe {
        let h = libc::dlopen(c"libnvidia-ml.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null(), "dlopen libnvidia-ml.so.1");
        let sym = |n: &std::ffi::CStr| {
            let p = libc::dlsym(h, n.as_ptr());
            assert!(!p.is_null(), "{n:?}");
            p
        };
        let init: nvml_pfn::Init = std::mem::transmute(sym(c"nvmlInit_v2"));
        let by_index: nvml_pfn::DeviceGetHandleByIndex =
            std::mem::transmute(sym(c"nvmlDeviceGetHandleByIndex_v2"));
        let procs: nvml_pfn::DeviceGetComputeRunningProcesses =
            std::mem::transmute(sym(c"nvmlDeviceGetComputeRunningProcesses_v3"));
        assert_eq!(init(), 0);
        let mut dev = std::ptr::null_mut();
        assert_eq!(by_index(0, &mut dev), 0);
        let mut buf = [NvmlProcessInfo::default(); 256];
        let mut n = buf.len() as c_uint;
        assert_eq!(procs(dev, &mut n, buf.as_mut_ptr()), 0);
        buf[..n as usize]
            .iter()
            .map(|i| (i.pid, i.used_gpu_memory))
            .collect()
    }
}

fn nvml_procs() -> ! {
    let list = nvml_list();
    let pids: Vec<String> = list.iter().map(|i| i.0.to_string()).collect();
    line(&[
        ("sum", list.iter().map(|i| i.1).sum::<u64>().to_string()),
        ("pids", format!("[{}]", pids.join(","))),
    ]);
    std::process::exit(0)
}

/// A tenant at the slice's host-pid resolver: `idle` connections opened
/// and never read, then a forked child and this process each ask; each
/// prints `{"answer","inner"}` (the resolver's answer, its own pid here)
/// and sleeps until killed.
fn resolver(idle: usize) -> ! {
    let path = gpuslice_ledger::limits::RecordPaths::in_slice().hostpid;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer, then the same record back.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    let held: Vec<_> = (0..idle)
        .map_while(|_| std::os::unix::net::UnixStream::connect(&path).ok())
        .collect();
    let ask = |idle: usize| {
        let answer = gpuslice_ledger::hostpid::ask(&path).map_or(-1, i64::from);
        line(&[
            ("idle", idle.to_string()),
            ("answer", answer.to_string()),
            ("inner", std::process::id().to_string()),
        ]);
    };
    // SAFETY: single-threaded here; the child only asks and sleeps.
    if unsafe { libc::fork() } == 0 {
        ask(0);
    } else {
        std::thread::sleep(Duration::from_millis(100));
        ask(held.len());
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// What the host's NVML says this process holds on GPU 0.
fn nvml_own() -> u64 {
    let me = gpuslice_ledger::hostpid::host_pid().map_or(std::process::id(), |h| h.pid);
    nvml_list().iter().filter(|i| i.0 == me).map(|i| i.1).sum()
}

/// A VMM handle created, mapped, released while mapped, then unmapped:
/// the ledger's use and NVML's figure for this process after each step.
fn vmm_mapped(cu: &Cuda, size: usize) {
    let create = f!(cu, MemCreate);
    let release = f!(cu, MemRelease);
    let reserve = f!(cu, MemAddressReserve);
    let map = f!(cu, MemMap);
    let unmap = f!(cu, MemUnmap);
    let prop = device0_prop();
    let (mut h, mut va) = (0, 0);
    let mut out = Vec::new();
    // SAFETY: valid arguments; the handle is mapped once, released once,
    // unmapped once.
    unsafe {
        out.push(("rc_create", create(&mut h, size, &prop, 0)));
        out.push(("rc_reserve", reserve(&mut va, size, 0, 0, 0)));
        out.push(("rc_map", map(va, size, 0, h, 0)));
    }
    let mapped = (used(), nvml_own());
    // SAFETY: as above.
    out.push(("rc_release", unsafe { release(h) }));
    let released = (used(), nvml_own());
    // SAFETY: as above.
    out.push(("rc_unmap", unsafe { unmap(va, size) }));
    let unmapped = (used(), nvml_own());
    let mut kv: Vec<(&str, String)> = out.iter().map(|(k, v)| (*k, v.to_string())).collect();
    for (k, (u, n)) in [
        ("mapped", mapped),
        ("released", released),
        ("unmapped", unmapped),
    ] {
        kv.push((k, format!("[{u},{n}]")));
    }
    line(&kv);
}

/// Allocates `bytes`, forks a child that exits without touching CUDA, and
/// reports the ledger before the fork, after the child's exit, and the
/// child's status: a child's exit must not release the parent's charges.
fn fork_keeps_charges(cu: &Cuda, bytes: usize) {
    let alloc = f!(cu, MemAlloc, "_v2");
    let mut p = 0;
    // SAFETY: valid out-pointer.
    let rc = unsafe { alloc(&mut p, bytes) };
    let before = used();
    // SAFETY: the child only calls exit (its atexit handlers and the
    // shim's destructor run, as they would in a real forked worker).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        std::process::exit(0);
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    line(&[
        ("rc", rc.to_string()),
        ("before", before.to_string()),
        ("after_child", used().to_string()),
        ("child_status", status.to_string()),
    ]);
}

/// Allocates `b0` on device 0 and `b1` on device 1 (each through its
/// primary context) and reports each device's ledger use and free memory.
fn two_devices(cu: &Cuda, b0: usize, b1: usize) {
    let retain = f!(cu, DevicePrimaryCtxRetain);
    let set = f!(cu, CtxSetCurrent);
    let alloc = f!(cu, MemAlloc, "_v2");
    let mut ctx = [std::ptr::null_mut(); 2];
    let mut rcs = Vec::new();
    let mut free = Vec::new();
    for (dev, bytes) in [(0, b0), (1, b1)] {
        let mut p = 0;
        // SAFETY: plain driver calls with valid out-pointers.
        unsafe {
            assert_eq!(retain(&mut ctx[dev], dev as c_int), 0, "context {dev}");
            assert_eq!(set(ctx[dev]), 0);
        }
        settle_contexts(dev..dev + 1);
        // SAFETY: valid out-pointer.
        rcs.push(unsafe { alloc(&mut p, bytes) });
        free.push(mem_info(cu).1);
    }
    let ledger = ledger().expect("ledger");
    line(&[
        ("rc0", rcs[0].to_string()),
        ("rc1", rcs[1].to_string()),
        ("used0", ledger.used(0).to_string()),
        ("used1", ledger.used(1).to_string()),
        ("free0", free[0].to_string()),
        ("free1", free[1].to_string()),
    ]);
}

/// A stream made on device 1, then `cuMemAllocAsync` on it with device 0's
/// context current: the ledger's use of both devices after it.
fn async_on_other_device(cu: &Cuda, bytes: usize) {
    let retain = f!(cu, DevicePrimaryCtxRetain);
    let set = f!(cu, CtxSetCurrent);
    let create = f!(cu, StreamCreate);
    let alloc = f!(cu, MemAllocAsync);
    let (mut c0, mut c1, mut stream) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        assert_eq!(retain(&mut c1, 1), 0);
        assert_eq!(set(c1), 0);
        assert_eq!(create(&mut stream, 0), 0);
        assert_eq!(retain(&mut c0, 0), 0);
        assert_eq!(set(c0), 0);
    }
    settle_contexts(0..2);
    let ledger = ledger().expect("ledger");
    let before = (ledger.used(0), ledger.used(1));
    let mut p = 0;
    // SAFETY: valid out-pointer, a live stream.
    let rc = unsafe { alloc(&mut p, bytes, stream) };
    line(&[
        ("rc", rc.to_string()),
        ("before0", before.0.to_string()),
        ("before1", before.1.to_string()),
        ("used0", ledger.used(0).to_string()),
        ("used1", ledger.used(1).to_string()),
    ]);
}

/// `cuMemAllocFromPoolAsync` of `bytes` from a pool on device 1, a host
/// pool, a managed pool on device 1 and device 1's default pool, with
/// device 0's context current: per pool, the rc and the ledger's change on
/// devices 0 and 1.
fn pool_location(cu: &Cuda, bytes: usize) {
    let retain = f!(cu, DevicePrimaryCtxRetain);
    let create = f!(cu, MemPoolCreate);
    let from = f!(cu, MemAllocFromPoolAsync);
    let default_pool = f!(
        cu,
        "cuDeviceGetDefaultMemPool",
        "cuDeviceGetDefaultMemPool",
        pfn::DeviceGetMemPool
    );
    let mut c1 = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; device 1's context is made (and charged)
    // before the baseline, device 0's stays current.
    assert_eq!(unsafe { retain(&mut c1, 1) }, 0);
    settle_contexts(0..2);
    let ledger = ledger().expect("ledger");
    let mut kv = Vec::new();
    // (name, allocation type, location type, device); allocation type 0:
    // the device's default pool.
    for (name, alloc_type, loc_type, loc_id) in [
        (
            "device1",
            CU_MEM_ALLOCATION_TYPE_PINNED,
            CU_MEM_LOCATION_TYPE_DEVICE,
            1,
        ),
        (
            "host",
            CU_MEM_ALLOCATION_TYPE_PINNED,
            CU_MEM_LOCATION_TYPE_HOST,
            0,
        ),
        (
            "managed",
            CU_MEM_ALLOCATION_TYPE_MANAGED,
            CU_MEM_LOCATION_TYPE_DEVICE,
            1,
        ),
        ("default1", 0, CU_MEM_LOCATION_TYPE_DEVICE, 1),
    ] {
        let props = pool_props(alloc_type, loc_type, loc_id);
        let (u0, u1) = (ledger.used(0), ledger.used(1));
        let (mut pool, mut p) = (std::ptr::null_mut(), 0);
        // SAFETY: valid props and out-pointers; the NULL stream.
        let rc = unsafe {
            let made = match alloc_type {
                0 => default_pool(&mut pool, loc_id),
                _ => create(&mut pool, &props),
            };
            match made {
                0 => from(&mut p, bytes, pool, std::ptr::null_mut()),
                e => e,
            }
        };
        kv.push((
            name.to_string(),
            format!(
                "[{rc},{},{}]",
                change(ledger.used(0), u0),
                change(ledger.used(1), u1)
            ),
        ));
    }
    let kv: Vec<(&str, String)> = kv.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    line(&kv);
}

/// A pool on device 0, `bytes` from it, the pool destroyed with that
/// allocation outstanding, then the allocation freed (`FREE`:
/// `cuMemFreeAsync` or `cuMemFree`): return codes and [ledger, NVML] after
/// each step.
fn pool_destroy(cu: &Cuda, bytes: usize, free_with: &str) {
    let create = f!(cu, MemPoolCreate);
    let from = f!(cu, MemAllocFromPoolAsync);
    let destroy = f!(cu, MemPoolDestroy);
    let free_async = f!(cu, MemFreeAsync);
    let free = f!(cu, MemFree, "_v2");
    let props = pool_props(
        CU_MEM_ALLOCATION_TYPE_PINNED,
        CU_MEM_LOCATION_TYPE_DEVICE,
        0,
    );
    let (mut pool, mut p) = (std::ptr::null_mut(), 0);
    let mut kv = Vec::new();
    // SAFETY: valid props and out-pointers; the pool is destroyed once, the
    // allocation freed once, on the NULL stream.
    unsafe {
        kv.push(("rc_create", create(&mut pool, &props).to_string()));
        kv.push((
            "rc_alloc",
            from(&mut p, bytes, pool, std::ptr::null_mut()).to_string(),
        ));
        kv.push(("allocated", format!("[{},{}]", used(), nvml_own())));
        kv.push(("rc_destroy", destroy(pool).to_string()));
        kv.push(("destroyed", format!("[{},{}]", used(), nvml_own())));
        let rc = match free_with {
            "cuMemFree" => free(p),
            _ => free_async(p, std::ptr::null_mut()),
        };
        kv.push(("rc_free", rc.to_string()));
        kv.push(("freed", format!("[{},{}]", used(), nvml_own())));
    }
    line(&kv);
}

/// The shim's context estimate (`resident::DEFAULT_CONTEXT_BYTES`): a
/// charge at or above it is a context not measured yet.
const CONTEXT_ESTIMATE: u64 = 1 << 30;

/// `CUmemPoolProps` of a pool of `alloc_type` memory at `location`.
fn pool_props(alloc_type: c_int, location_type: c_int, location_id: c_int) -> CUmemPoolProps {
    CUmemPoolProps {
        alloc_type,
        handle_types: 0,
        location_type,
        location_id,
        win32_security_attributes: std::ptr::null_mut(),
        max_size: 0,
        usage: 0,
        reserved: [0; 54],
    }
}

/// A 4-channel `CUDA_ARRAY3D_DESCRIPTOR` (`depth` 0: a 1D or 2D array).
fn array3d(
    width: usize,
    height: usize,
    depth: usize,
    format: c_int,
    flags: c_uint,
) -> Array3DDescriptor {
    Array3DDescriptor {
        width,
        height,
        depth,
        format,
        num_channels: 4,
        flags,
    }
}

/// `cuMemCreate`'s properties for plain device memory on device 0.
fn device0_prop() -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location_type: CU_MEM_LOCATION_TYPE_DEVICE,
        location_id: 0,
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}
