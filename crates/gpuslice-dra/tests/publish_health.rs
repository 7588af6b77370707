//! Health re-publication: an XID injected into the fake NVML taints the
//! GPU's devices in the published pool (`NoSchedule`, the XID as value);
//! after recovery the taints go.
//! The fake NVML follows `FAKEGPU_ROOT`, one host per process: the test
//! holds `gpuslice_testkit::fakenvml::serve` on its host throughout.

use crate::common::{
    device_names, fake_api, follow_for_an_hour, published_devices, published_names,
    published_slice, wait_for_the_xid_watcher,
};
use fakegpu::FakeHost;
use gpuslice_dra::publish::{SharedPolicy, UNHEALTHY_TAINT};
use gpuslice_health::Config as Health;
use gpuslice_testkit::fakeapi::FakeApiServer;
use gpuslice_testkit::wait_until;
use std::time::Duration;

/// The names of the published devices that carry a taint.
fn tainted(api: &FakeApiServer) -> Vec<String> {
    device_names(
        published_devices(api)
            .iter()
            .filter(|d| d["taints"].is_array()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_taints_the_gpus_devices_until_it_recovers() {
    let h = FakeHost::builder().gpus(3).build().unwrap();
    let _nvml = gpuslice_testkit::fakenvml::serve(h.root());
    let inv = gpuslice_testkit::fakenvml::discover(&h);
    let (fake, api) = fake_api().await;
    let (tx, rx) = tokio::sync::watch::channel(Default::default());
    let health = Health {
        recover_after_seconds: 1,
        ..Health::default()
    };
    let watcher = gpuslice_health::start(&inv, &health, Some(h.nvml_lib()), tx);
    let mut watching = rx.clone();
    let policy = SharedPolicy::default();
    let (_inv_tx, inv_rx) = tokio::sync::watch::channel(inv.clone());
    let follower = follow_for_an_hour(api, policy, inv_rx, rx);
    let all = |n: &[String]| n.iter().any(|x| x == "gpu-1") && n.iter().any(|x| x == "gpu-0");
    wait_until("first publication", Duration::from_secs(10), || {
        all(&published_names(&fake))
    })
    .await;
    wait_for_the_xid_watcher(&mut watching).await;

    // An application XID changes nothing; a critical one taints every
    // device of GPU 1, which stays in the pool.
    h.inject_xid(1, 13).unwrap();
    h.inject_xid(1, 79).unwrap();
    let took = wait_until("GPU 1 tainted after XID 79", Duration::from_secs(5), || {
        !tainted(&fake).is_empty()
    })
    .await;
    eprintln!("re-published {took:?} after the XID");
    assert_eq!(tainted(&fake), ["gpu-1"]);
    assert!(all(&published_names(&fake)));
    let s = published_slice(&fake);
    assert_eq!(s["spec"]["pool"]["generation"], 2);
    let d = &s["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "gpu-1")
        .unwrap()["taints"];
    assert_eq!(d.as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d[0]["key"], UNHEALTHY_TAINT);
    assert_eq!(d[0]["value"], "79");
    assert_eq!(d[0]["effect"], "NoSchedule");
    let added = d[0]["timeAdded"].as_str().unwrap();
    assert!(added.ends_with('Z') && added.len() == 20, "{added}");

    // Quiet for recoverAfterSeconds and answering: untainted, at
    // generation 3.
    wait_until(
        "GPU 1 untainted after recovery",
        Duration::from_secs(10),
        || tainted(&fake).is_empty(),
    )
    .await;
    assert!(all(&published_names(&fake)));
    assert_eq!(published_slice(&fake)["spec"]["pool"]["generation"], 3);
    drop(watcher); // the health sender goes: follow returns
    tokio::time::timeout(Duration::from_secs(5), follower)
        .await
        .expect("follow ends with its health source")
        .unwrap();
}
