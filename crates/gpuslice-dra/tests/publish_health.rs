//! Health re-publication: an XID injected into the fake NVML taints the
//! GPU's devices in the published pool (`NoSchedule`, the XID as value);
//! after recovery the taints go.
//! The fake NVML follows `FAKEGPU_ROOT`, one host per process: the test
//! holds `gpuslice_testkit::fakenvml::serve` on its host throughout.

use fakegpu::FakeHost;
use gpuslice_dra::apiserver::KubeApi;
use gpuslice_dra::publish::{follow, slice_name, SharedPolicy, UNHEALTHY_TAINT};
use gpuslice_dra::DRIVER_NAME;
use gpuslice_health::Config as Health;
use gpuslice_testkit::fakeapi::FakeApiServer;
use gpuslice_testkit::wait_until;
use serde_json::Value;
use std::time::Duration;

const NODE: &str = "node-a";

fn slice0(api: &FakeApiServer) -> Value {
    api.slices()
        .remove(&slice_name(NODE, DRIVER_NAME, 0))
        .expect("slice 0 published")
}

/// The device names published for `node` now.
fn published_names(api: &FakeApiServer) -> Vec<String> {
    api.slices()
        .get(&slice_name(NODE, DRIVER_NAME, 0))
        .and_then(|s| s["spec"]["devices"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

/// The names of the published devices that carry a taint.
fn tainted(api: &FakeApiServer) -> Vec<String> {
    api.slices()
        .get(&slice_name(NODE, DRIVER_NAME, 0))
        .and_then(|s| s["spec"]["devices"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|d| d["taints"].is_array())
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xid_taints_the_gpus_devices_until_it_recovers() {
    let h = FakeHost::builder().gpus(3).build().unwrap();
    let _nvml = gpuslice_testkit::fakenvml::serve(h.root());
    let inv = gpuslice_testkit::fakenvml::discover(&h);
    let fake = FakeApiServer::start().await;
    let api = KubeApi::new(&fake.url, None).unwrap();
    let (tx, rx) = tokio::sync::watch::channel(Default::default());
    let health = Health {
        recover_after_seconds: 1,
        ..Health::default()
    };
    let watcher = gpuslice_health::start(&inv, &health, Some(h.nvml_lib()), tx);
    let mut watching = rx.clone();
    let policy = SharedPolicy::default();
    let (_inv_tx, inv_rx) = tokio::sync::watch::channel(inv.clone());
    let follower = {
        tokio::spawn(async move {
            follow(
                &api,
                DRIVER_NAME,
                gpuslice_dra::feed::NodeFeed::enforced(NODE, policy, inv_rx, rx),
                Duration::from_secs(3600),
            )
            .await
        })
    };
    let all = |n: &[String]| n.iter().any(|x| x == "gpu-1") && n.iter().any(|x| x == "gpu-0");
    wait_until("first publication", Duration::from_secs(10), || {
        all(&published_names(&fake))
    })
    .await;
    tokio::time::timeout(
        Duration::from_secs(10),
        watching.wait_for(|s| s.watching == "events"),
    )
    .await
    .expect("the XID watcher runs")
    .unwrap();

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
    let s = slice0(&fake);
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
    assert_eq!(slice0(&fake)["spec"]["pool"]["generation"], 3);
    drop(watcher); // the health sender goes: follow returns
    tokio::time::timeout(Duration::from_secs(5), follower)
        .await
        .expect("follow ends with its health source")
        .unwrap();
}
