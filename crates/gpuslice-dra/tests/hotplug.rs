//! Hot-plug: a GPU leaving or joining the fake host re-publishes the
//! pool (a new generation, its devices gone or back) without a restart.
//! The fake NVML follows `FAKEGPU_ROOT`, one host per process: the test
//! holds `gpuslice_testkit::fakenvml::serve` on its host throughout.

use crate::common::{fake_api, follow_for_an_hour, nvml_host, pool_slice, published_names};
use fakegpu::FakeHost;
use gpuslice_core::discover::{discover, DiscoverOptions};
use gpuslice_core::HostRoot;
use gpuslice_dra::hotplug;
use gpuslice_dra::publish::SharedPolicy;
use gpuslice_testkit::fakeapi::FakeApiServer;
use gpuslice_testkit::{wait_until, FAST_PATH_LIMIT};
use std::time::Duration;

fn generation(api: &FakeApiServer) -> i64 {
    pool_slice(api).unwrap()["spec"]["pool"]["generation"]
        .as_i64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_leaving_and_joining_the_host_is_republished_without_the_poll() {
    let (h, _nvml, root, opts) = nvml_host(3);
    let inv = discover(&root, &opts).unwrap();
    assert_eq!(inv.gpus.len(), 3);
    let (fake, api) = fake_api().await;
    let (inv_tx, inv_rx) = tokio::sync::watch::channel(inv);
    // The XID watcher holds NVML open, as in the plugin: NVML enumerated
    // the GPUs at its first init and still lists one that left.
    let (health_tx, health_rx) = tokio::sync::watch::channel(Default::default());
    let _watcher = gpuslice_health::start(
        &inv_rx.borrow(),
        &Default::default(),
        Some(h.nvml_lib()),
        health_tx,
    );
    let follower = follow_for_an_hour(api, SharedPolicy::default(), inv_rx, health_rx);
    let rescan = {
        let root = root.clone();
        // A poll far longer than the test: inotify must do the work.
        tokio::spawn(hotplug::watch(
            root.clone(),
            Duration::from_secs(3600),
            move || Ok(discover(&root, &opts)?),
            inv_tx,
        ))
    };
    let has = |n: &[String], d: &str| n.iter().any(|x| x == d);
    wait_until("first publication", Duration::from_secs(10), || {
        has(&published_names(&fake), "gpu-2")
    })
    .await;
    assert_eq!(generation(&fake), 1);

    h.unplug_gpu(2).unwrap();
    let took = wait_until("GPU 2 gone", FAST_PATH_LIMIT, || {
        !published_names(&fake)
            .iter()
            .any(|n| n.starts_with("gpu-2"))
    })
    .await;
    eprintln!("re-published {took:?} after the unplug");
    let n = published_names(&fake);
    assert!(has(&n, "gpu-0") && has(&n, "gpu-1"), "{n:?}");
    assert_eq!(generation(&fake), 2);

    h.plug_gpu(2).unwrap();
    wait_until("GPU 2 back", FAST_PATH_LIMIT, || {
        let n = published_names(&fake);
        has(&n, "gpu-2")
    })
    .await;
    assert_eq!(generation(&fake), 3);
    let s = pool_slice(&fake).unwrap();
    let gpu2 = s["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "gpu-2")
        .unwrap()
        .clone();
    assert_eq!(
        gpu2["attributes"]["uuid"]["string"],
        h.gpus()[2].uuid.as_str()
    );

    // GPU 0 leaves: the others move down (bus order), as CUDA numbers them.
    h.unplug_gpu(0).unwrap();
    wait_until("GPU 0 gone", FAST_PATH_LIMIT, || {
        !has(&published_names(&fake), "gpu-2")
    })
    .await;
    let s = pool_slice(&fake).unwrap();
    let uuids: Vec<&str> = s["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["attributes"]["type"]["string"] == "gpu")
        .map(|d| d["attributes"]["uuid"]["string"].as_str().unwrap())
        .collect();
    assert_eq!(uuids, [&h.gpus()[1].uuid, &h.gpus()[2].uuid]);

    follower.abort();
    // The rescanner ends once nobody listens.
    tokio::time::timeout(Duration::from_secs(5), rescan)
        .await
        .expect("the rescanner ends with its receivers")
        .unwrap();
}

/// procfs sends no inotify events; here the GPUs' proc directory does
/// not exist when the watcher starts (the driver loads later), so no
/// watch is on it and only the poll can see the GPU arrive.
#[tokio::test]
async fn a_driver_loaded_later_is_noticed_by_the_poll() {
    let h = FakeHost::builder().gpus(2).build().unwrap();
    let (root, opts) = procfs_only(&h);
    let gpus = h.path("proc/driver/nvidia/gpus");
    let bus = &h.gpus()[0].pci_bus_id;
    let info = std::fs::read(gpus.join(bus).join("information")).unwrap();
    std::fs::remove_dir_all(&gpus).unwrap();
    let (tx, mut rx) = tokio::sync::watch::channel(discover(&root, &opts).unwrap());
    assert_eq!(rx.borrow_and_update().gpus.len(), 0);
    let r = root.clone();
    let task = tokio::spawn(hotplug::watch(
        root.clone(),
        Duration::from_millis(200),
        move || Ok(discover(&r, &opts)?),
        tx,
    ));
    tokio::time::sleep(Duration::from_millis(50)).await;
    std::fs::create_dir_all(gpus.join(bus)).unwrap();
    std::fs::write(gpus.join(bus).join("information"), info).unwrap();
    sent_then_ended(rx, task, 1, "rediscovered by the poll").await;
}

/// Waits for the watcher to send an inventory (panics with `what` if it
/// does not), checks it holds `gpus` GPUs, and that the watcher ends once
/// `rx`, its last receiver, is gone.
async fn sent_then_ended(
    mut rx: tokio::sync::watch::Receiver<gpuslice_core::Inventory>,
    task: tokio::task::JoinHandle<()>,
    gpus: usize,
    what: &str,
) {
    tokio::time::timeout(FAST_PATH_LIMIT, rx.changed())
        .await
        .expect(what)
        .unwrap();
    assert_eq!(rx.borrow().gpus.len(), gpus);
    drop(rx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the watcher ends with its receivers")
        .unwrap();
}

fn procfs_only(h: &FakeHost) -> (HostRoot, DiscoverOptions) {
    let opts = DiscoverOptions {
        use_nvml: false,
        ..DiscoverOptions::default()
    };
    (HostRoot::new(h.root()), opts)
}

/// The inventory handed to the watcher was discovered before its watches
/// existed: a GPU leaving in between sends no event they could see, and
/// the hour-long poll would be the first to notice.
#[tokio::test]
async fn a_gpu_that_left_before_the_watch_began_is_caught_up_at_start() {
    let h = FakeHost::builder().gpus(2).build().unwrap();
    let (root, opts) = procfs_only(&h);
    let (tx, mut rx) = tokio::sync::watch::channel(discover(&root, &opts).unwrap());
    assert_eq!(rx.borrow_and_update().gpus.len(), 2);
    h.unplug_gpu(1).unwrap();
    let r = root.clone();
    let task = tokio::spawn(hotplug::watch(
        root,
        Duration::from_secs(3600),
        move || Ok(discover(&r, &opts)?),
        tx,
    ));
    sent_then_ended(rx, task, 1, "caught up without waiting for the poll").await;
}

/// A rediscovery that fails (NVML busy, a GPU's files half written) is
/// tried again soon, not at the next event or poll: the change that
/// caused it has already been read off the inotify descriptor.
#[tokio::test]
async fn a_failed_rediscovery_is_tried_again_without_the_poll() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let h = FakeHost::builder().gpus(2).build().unwrap();
    let (root, opts) = procfs_only(&h);
    let (tx, mut rx) = tokio::sync::watch::channel(discover(&root, &opts).unwrap());
    rx.borrow_and_update();
    let fail_next = Arc::new(AtomicBool::new(false));
    let (calls, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (r, f, c, d) = (root.clone(), fail_next.clone(), calls.clone(), done.clone());
    let task = tokio::spawn(hotplug::watch(
        root,
        Duration::from_secs(3600),
        move || {
            c.fetch_add(1, Ordering::SeqCst);
            anyhow::ensure!(!f.swap(false, Ordering::SeqCst), "NVML busy");
            let inv = discover(&r, &opts)?;
            d.fetch_add(1, Ordering::SeqCst);
            Ok(inv)
        },
        tx,
    ));
    // The catch-up at start is over (so the next call is the one to
    // fail), and the watches made before it are in place.
    wait_until("the watcher's start", FAST_PATH_LIMIT, || {
        done.load(Ordering::SeqCst) >= 1
    })
    .await;
    fail_next.store(true, Ordering::SeqCst);
    h.unplug_gpu(1).unwrap();
    sent_then_ended(rx, task, 1, "tried again without waiting for the poll").await;
    assert!(
        calls.load(Ordering::SeqCst) >= 3,
        "the failed call and its retry"
    );
}
