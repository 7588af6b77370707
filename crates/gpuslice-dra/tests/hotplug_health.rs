//! Hot-plug and health together: after a GPU leaves, the XID watcher
//! starts over on the GPUs there now, so an XID is reported at the GPU's
//! new index (not its old one) and the old numbering's health is gone.
//! The fake NVML follows `FAKEGPU_ROOT`, one host per process: the test
//! holds `gpuslice_testkit::fakenvml::serve` on its host throughout.

use crate::common::{driver_options, nvml_host, wait_for_the_xid_watcher};
use gpuslice_core::discover::discover;
use gpuslice_dra::apiserver::KubeApi;
use gpuslice_dra::driver::Driver;
use gpuslice_dra::hotplug::{apply, bound_only};
use gpuslice_health::Config as Health;
use gpuslice_health::{start, Snapshot};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_gpu_leaves_xids_are_reported_at_the_new_indexes() {
    let (h, _nvml, root, opts) = nvml_host(3);
    let inv = discover(&root, &opts).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let driver = Arc::new(
        Driver::new(
            driver_options(root.clone(), inv.clone(), dir.path()),
            // Never called here.
            Arc::new(KubeApi::new("http://127.0.0.1:9", None).unwrap()),
        )
        .unwrap(),
    );
    let health = Health {
        recover_after_seconds: 3600,
        ..Health::default()
    };
    let (tx, mut rx) = tokio::sync::watch::channel(Snapshot::default());
    let watcher = start(&inv, &health, Some(h.nvml_lib()), tx.clone());
    wait_for_the_xid_watcher(&mut rx).await;
    h.inject_xid(2, 79).unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        rx.wait_for(|s| s.unhealthy.contains_key(&2)),
    )
    .await
    .expect("GPU 2 unhealthy")
    .unwrap();

    let (inv_tx, inv_rx) = tokio::sync::watch::channel(inv);
    let task = tokio::spawn(apply(
        inv_rx,
        driver,
        health,
        Some(h.nvml_lib()),
        tx,
        watcher,
    ));
    // GPU 0 leaves: the GPU that was 2 is 1 now.
    h.unplug_gpu(0).unwrap();
    let now = bound_only(&root, discover(&root, &opts).unwrap());
    assert_eq!(now.gpus[1].uuid, h.gpus()[2].uuid);
    inv_tx.send(now).unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        rx.wait_for(|s| s.unhealthy.is_empty()),
    )
    .await
    .expect("the old numbering's health is cleared")
    .unwrap();
    // The new watcher registers its events in its own time; an XID
    // injected before that is not delivered, so inject until one lands.
    let t0 = Instant::now();
    loop {
        h.inject_xid(2, 79).unwrap();
        let got = tokio::time::timeout(
            Duration::from_millis(300),
            rx.wait_for(|s| !s.unhealthy.is_empty()),
        )
        .await;
        if let Ok(s) = got {
            let keys: Vec<u32> = s.unwrap().unhealthy.keys().copied().collect();
            assert_eq!(keys, [1], "the XID is reported at the GPU's new index");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no XID reported");
    }
    drop(inv_tx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("apply ends with its inventory sender")
        .unwrap();
}
